"""What bounds the draft heads on the held-out text: the model's own uncertainty about the next token.

Head 0 reads the state at position p and proposes tokens for p+2 without knowing the token drawn at
p+1. The best proposal any head can make there (infinite data and capacity) is the Bayes-optimal
mixture q_p(x) = sum_c P(c) P(x | text to p, c) over the candidates c for p+1. This script computes
q_p exactly (one forward of every candidate, each attending to the text up to p) and reports:

* sampled (the paper's sampling, the text `heads eval` replays: same prefix, length and seed): how
  often the token drawn at p+2 is in the top-1 / top-3 of q_p, of the target's own distribution at
  p+2 (what the oracle sees: it knows p+1) and of the given heads' head 0; and the tokens per step of
  the paper's tree with q_p as head 0 (no deeper heads, and with the oracle's deeper levels), beside
  the oracle, no heads and the given heads;
* teacher-forced (the held-out text itself, `heads eval`'s accuracy): how often argmax q_p (mixture
  over the model's top-`--candidates` tokens at p+1, renormalised) is the model's own top-1 at p+2 given
  the true token at p+1, the metric of "head 1 top-1", beside the heads' own.

    nice -n 19 .venv/bin/python heads/bound.py --heads default --threads 1
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from dataclasses import replace

import torch
from transformers import DynamicCache

from tokenswift_cli.config import DraftConfig, ModelSpec, SamplingConfig
from tokenswift_cli.data import HELD_OUT_TEXT
from tokenswift_cli.model.heads import DraftHeads, resolve_heads
from tokenswift_cli.model.loading import end_of_text_ids, load_model
from tokenswift_cli.sampling.defaults import PAPER
from tokenswift_cli.sampling.distribution import target_scores
from tokenswift_cli.train.acceptance import _tokens_per_step, write_text
from tokenswift_cli.train.data import read_states

Scores = Callable[[torch.Tensor, list[int]], torch.Tensor]  # (logits [vocab], context) -> scores [vocab]


@torch.no_grad()
def mixtures(model, tokens: Sequence[int], roots: Sequence[int], support: Callable[[int], dict[int, float]],
             scores: Scores, *, chunk: int = 384) -> dict[int, torch.Tensor]:  # fmt: skip
    """q_p `[vocab]` for each root p: the candidates c (weights from `support(p)`) read at p+1 after the
    text up to p (one cached prefix, a mask per candidate), their next-token distributions mixed."""
    decoder, lm_head = model.get_decoder(), model.get_output_embeddings()
    cache = DynamicCache()
    length = max(roots) + 1
    decoder(input_ids=torch.tensor([list(tokens[:length])]), cache=cache, use_cache=True)
    extra = [(p, c, w) for p in roots for c, w in support(p).items()]
    out: dict[int, torch.Tensor] = {}
    for start in range(0, len(extra), chunk):
        part = extra[start : start + chunk]
        n = len(part)
        at = torch.tensor([p for p, _, _ in part])
        mask = torch.zeros(n, length + n, dtype=torch.bool)
        mask[:, :length] = torch.arange(length)[None] <= at[:, None]  # the text up to its root
        mask[:, length:] = torch.eye(n, dtype=torch.bool)  # and itself
        hidden = decoder(input_ids=torch.tensor([[c for _, c, _ in part]]), attention_mask=mask[None, None],
                         position_ids=(at + 1)[None], cache=cache, use_cache=True).last_hidden_state[0]  # fmt: skip
        cache.crop(-n)  # back to the text alone
        for (p, c, w), logits in zip(part, lm_head(hidden), strict=True):
            probs = torch.softmax(scores(logits, [*tokens[: p + 1], c]), dim=-1)
            out[p] = out[p] + w * probs if p in out else w * probs
    return out


def top(scores: torch.Tensor, k: int) -> tuple[int, ...]:
    return tuple(scores.topk(k).indices.tolist())


@torch.no_grad()
def sampled_bound(loaded, heads: DraftHeads | None, sampling: SamplingConfig, prefix: int, new_tokens: int) -> dict:
    """On the text the model writes after the held-out prefix (as `heads eval` writes it)."""
    model, draft = loaded.model, DraftConfig()
    prompt = loaded.tokenizer(HELD_OUT_TEXT.read_text(encoding="utf-8"))["input_ids"][:prefix]
    tokens = write_text(model, prompt, new_tokens, sampling)
    pre_norm, post = read_states(model, torch.tensor(tokens))
    lm_head = model.get_output_embeddings()

    def scored(logits: torch.Tensor, context: list[int]) -> torch.Tensor:
        return target_scores(logits, torch.tensor(context[-sampling.context_length :]), sampling)

    dist = {q: scored(lm_head(post[q - 1]), tokens[:q]) for q in range(prefix, len(tokens))}  # draw at q
    roots = list(range(prefix - 1, len(tokens) - 2))

    def support(p: int) -> dict[int, float]:
        probs = torch.softmax(dist[p + 1], dim=-1)
        ids = (probs > 0).nonzero().flatten().tolist()
        return {c: float(probs[c]) for c in ids}

    q = mixtures(model, tokens, roots, support, scored)
    head0 = {p: scored(lm_head(heads(pre_norm[p])[0]), tokens[: p + 1]) for p in roots} if heads is not None else {}
    hits: dict[str, list[float]] = {name: [0.0, 0.0] for name in ("bayes head 0", "oracle (knows p+1)", "heads")}
    for p in roots:
        drawn = tokens[p + 2]
        for name, s in (("bayes head 0", q[p]), ("oracle (knows p+1)", dist[p + 2]), ("heads", head0.get(p))):
            if s is not None:
                hits[name][0] += drawn in top(s, 1)
                hits[name][1] += drawn in top(s, 3)
    w = draft.tree
    level1 = {p: top(dist[p + 1], w[0]) for p in range(prefix - 1, len(tokens) - 1)}
    deep = lambda p, d: top(dist[p + d], w[d - 1]) if p + d < len(tokens) else ()  # noqa: E731
    levels = {
        "no heads": lambda p: (level1[p],),
        "bayes head 0 only": lambda p: (level1[p], top(q[p], w[1])) if p in q else (level1[p],),
        "bayes head 0 + oracle deeper": lambda p: (level1[p], top(q[p], w[1]) if p in q else (), deep(p, 3),
                                                   deep(p, 4)),
        "oracle tree + n-gram": lambda p: (level1[p], deep(p, 2), deep(p, 3), deep(p, 4)),
    }  # fmt: skip
    if heads is not None:
        with_heads = {
            p: [top(scored(lm_head(s), tokens[: p + 1]), k) for s, k in zip(heads(pre_norm[p]), w[1:], strict=False)]
            for p in level1
        }
        levels["heads"] = lambda p: (level1[p], *with_heads[p])
    lag = sampling.penalty_window
    n = len(roots)
    return {
        "prefix_tokens": prefix, "tokens": len(tokens) - prefix,
        "drawn_in_top1_top3_at_p2": {k: [round(v[0] / n, 3), round(v[1] / n, 3)] for k, v in hits.items()},
        "tokens_per_step": {k: round(_tokens_per_step(tokens, prefix, f, draft, lag=lag), 3)
                            for k, f in levels.items()},
    }  # fmt: skip


@torch.no_grad()
def forced_bound(loaded, heads: DraftHeads | None, tokens_read: int, every: int, candidates: int) -> dict:
    """On the held-out text read teacher-forced: can any head name the model's own top-1 at p+2?"""
    model = loaded.model
    tokens = loaded.tokenizer(HELD_OUT_TEXT.read_text(encoding="utf-8"))["input_ids"][:tokens_read]
    pre_norm, post = read_states(model, torch.tensor(tokens))
    lm_head = model.get_output_embeddings()
    roots = list(range(0, len(tokens) - 2, every))

    def support(p: int) -> dict[int, float]:
        probs = torch.softmax(lm_head(post[p]).float(), dim=-1)
        values, ids = probs.topk(candidates)
        return dict(zip(ids.tolist(), (values / values.sum()).tolist(), strict=True))

    q = mixtures(model, tokens, roots, support, lambda logits, context: logits.float())
    counts = {"bayes head 0": [0, 0], "heads": [0, 0]}
    mass = 0.0
    for p in roots:
        target = int(lm_head(post[p + 1]).argmax())  # the model's own top-1 at p+2, the true p+1 read
        mass += float(torch.softmax(lm_head(post[p]).float(), -1).topk(candidates).values.sum())
        for name, s in (("bayes head 0", q[p]), ("heads", lm_head(heads(pre_norm[p])[0]) if heads else None)):
            if s is not None:
                counts[name][0] += target in top(s, 1)
                counts[name][1] += target in top(s, 3)
    n = len(roots)
    return {
        "positions": n, "candidates": candidates, "candidate_mass": round(mass / n, 3),
        "model_top1_top3_at_p2": {k: [round(v[0] / n, 3), round(v[1] / n, 3)] for k, v in counts.items()},
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--heads", default="default", help="heads file, 'default' or 'none'")
    parser.add_argument("--prefix-tokens", type=int, default=1024)
    parser.add_argument("--new-tokens", type=int, default=512)
    parser.add_argument("--tokens", type=int, default=4096, help="held-out tokens read for the teacher-forced part")
    parser.add_argument("--every", type=int, default=4, help="teacher-forced: one root every this many positions")
    parser.add_argument("--candidates", type=int, default=8, help="teacher-forced: tokens mixed at p+1")
    parser.add_argument("--skip-forced", action="store_true")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load_model(ModelSpec(weights="dense", dtype="float32"), attn_implementation="sdpa")
    heads = resolve_heads(args.heads, loaded)[0] if args.heads != "none" else None
    sampling = replace(PAPER, suppress_token_ids=tuple(end_of_text_ids(loaded)))
    report = {
        "heads": args.heads,
        "sampled": sampled_bound(loaded, heads, sampling, args.prefix_tokens, args.new_tokens),
    }
    print(json.dumps(report), flush=True)
    if not args.skip_forced:
        report["forced"] = forced_bound(loaded, heads, args.tokens, args.every, args.candidates)
        print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
