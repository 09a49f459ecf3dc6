"""The most any drafter could gain on a run: the target's own top-w tokens as the drafts.

For every generated position of a run, the target distribution the run sampled from (its penalty,
filters, temperature and suppressed tokens, from its settings) ranks the token that was drawn. An
oracle drafter proposes, at depth d below the root, the target's own top-w_d tokens along the true
path (real heads and n-grams can only do worse); a step then commits the root plus the longest run
of following positions whose drawn token ranks below its level's width. Replaying the text step by
step gives the oracle's tokens per step for each tree shape: no drafter with that shape commits more
per verification, so TokenSwift's speedup over plain decoding is at most that number times
(plain step time / verification step time).

It also replays the n-gram table alone (no model needed): its top-k continuations of each root,
counted over the text up to `lag` tokens back (the reference leaves out the penalty window), give
the tokens per step an n-gram-only drafter would reach, with and without that lag.

    .venv/bin/python benchmarks/acceptance_bound.py RUN_DIR [--threads 1] [--max-tokens 8192]

RUN_DIR is a run folder (e.g. $TOKENSWIFT_HOME/runs/run-001); it reads the tokens of its latest
checkpoint, so a run still in progress can be measured. (`tokenswift heads eval` replays the draft
pass itself, with and without heads, on text the model writes, beside the same oracle.)
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors.torch import load_file

from tokenswift_cli.config import ModelSpec, RunConfig
from tokenswift_cli.engine.ngram import NGramTable
from tokenswift_cli.model.cache import FullCache
from tokenswift_cli.model.loading import load_model
from tokenswift_cli.model.rope import apply_rope, plan_rope
from tokenswift_cli.model.target import Target
from tokenswift_cli.runs.checkpoint import read_manifest
from tokenswift_cli.sampling.distribution import target_scores
from tokenswift_cli.train.acceptance import oracle_tokens_per_step

SHAPES = {"chain-1": (1,), "chain-2": (1, 1), "chain-4": (1, 1, 1, 1), "3": (3,), "3,3,3": (3, 3, 3),
          "1,3,3,3": (1, 3, 3, 3), "8,8,8,8": (8, 8, 8, 8)}  # fmt: skip


def run_tokens(run_dir: Path) -> tuple[list[int], int]:
    """Committed tokens (prefix included) of the run's latest checkpoint, and the prefix length."""
    manifest = read_manifest(run_dir)
    if manifest is None:
        raise SystemExit(f"{run_dir} has no checkpoint yet")
    state_file = next(f["name"] for f in manifest["files"] if f["kind"] == "state")
    tokens = load_file(str(run_dir / "checkpoint" / state_file))["tokens"].tolist()
    return tokens, int(manifest["state"]["prefix_length"])


def ranks(target: Target, tokens: Sequence[int], start: int, cfg: RunConfig, chunk: int = 512) -> list[int]:
    """Rank of each token from `start` on under the target distribution it was drawn from (0 = top-1)."""
    cache = FullCache(target.num_layers, capacity=len(tokens) + chunk)
    out: list[int] = []
    for begin in range(0, len(tokens) - 1, chunk):
        piece = torch.tensor(tokens[begin : begin + chunk])
        hidden = target.forward(piece, cache).hidden  # row i predicts position begin + i + 1
        cache.commit(range(piece.shape[0]))
        for row in range(piece.shape[0]):
            position = begin + row + 1
            if position < start or position >= len(tokens):
                continue
            context = torch.tensor(tokens[max(0, position - cfg.sampling.penalty_window) : position])
            scores = target_scores(target.logits(hidden[row]), context, cfg.sampling)
            out.append(int((scores > scores[tokens[position]]).sum()))
    return out


def ngram_tokens_per_step(tokens: Sequence[int], start: int, *, size: int, top_k: int, lag: int) -> float:
    """Replay from `start` with drafts from the n-gram table only: root + longest matching continuation."""
    table, position, steps = NGramTable(size), start, 0
    while position < len(tokens):
        table.update(tokens, until=position + 1 - lag)  # the root at `position` is committed
        following = tuple(tokens[position + 1 : position + size])
        accepted = 0
        for path in table.top(tokens[position], top_k):
            match = next((i for i, (a, b) in enumerate(zip(path, following, strict=False)) if a != b), None)
            accepted = max(accepted, min(len(path), len(following)) if match is None else match)
        position += 1 + accepted
        steps += 1
    return (len(tokens) - start) / max(steps, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--max-tokens", type=int, default=None, help="only the first N generated tokens")
    parser.add_argument("--no-model", action="store_true", help="only the n-gram replay")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    settings = json.loads((args.run_dir / "settings.json").read_text())
    cfg = RunConfig.from_dict(settings["run_config"])
    spec = ModelSpec(**settings["model"]["spec"])
    tokens, prefix_length = run_tokens(args.run_dir)
    if args.max_tokens:
        tokens = tokens[: prefix_length + args.max_tokens]
    draft, window = cfg.draft, cfg.sampling.penalty_window
    result: dict[str, object] = {
        "run": str(args.run_dir), "generated_tokens": len(tokens) - prefix_length,
        "sampling": settings["run_config"]["sampling"],
        "ngram_tokens_per_step": {
            f"top{k}, lag {lag}": ngram_tokens_per_step(tokens, prefix_length, size=draft.ngram_size, top_k=k, lag=lag)
            for k in (1, draft.ngram_top_k or 4) for lag in (0, window)
        },
    }  # fmt: skip
    if not args.no_model:
        loaded = load_model(ModelSpec(**{**spec.__dict__, "rope_scaling": "none", "rope_factor": None}))
        apply_rope(loaded.model, plan_rope(spec, loaded.model.config, len(tokens)))
        token_ranks = ranks(Target(loaded.model), tokens, prefix_length, cfg)
        n = len(token_ranks)
        result["drawn_token_rank_below"] = {k: sum(r < k for r in token_ranks) / n for k in (1, 2, 3, 8)}
        result["oracle_tokens_per_step"] = {name: oracle_tokens_per_step(token_ranks, w) for name, w in SHAPES.items()}
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
