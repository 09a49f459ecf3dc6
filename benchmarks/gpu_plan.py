"""The embedded model's part of the GPU plan (gpu/run.sh): every result is a JSON line, written the moment it exists.

    python benchmarks/gpu_plan.py speed --out plan.jsonl     # (a) exactness, then (c) TokenSwift against plain
    python benchmarks/gpu_plan.py profile --out plan.jsonl   # (d) GPU time against wall time, one step at a time

`speed`: 2,048 tokens of a text outside the heads' training data (Paradise Lost), then, greedy and at the
paper's sampling: (a) 512 tokens with plain decoding and TokenSwift drafting auto, pass and verify, each
compared with plain token for token (these also capture the CUDA graphs); (c) 1,024 tokens of the same,
plus trees 1,3,3,3 and 3,3,3,3 for pass and verify, timed. `profile`: plain steps and drafted iterations
under torch's profiler: how much of a step the GPU is busy, the rest being the host's.
`--dry-run`: the tiny random model on this CPU, a few tokens (checks the script, not the GPU).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from tokenswift_cli.bench.compare import first_divergence
from tokenswift_cli.bench.models import BenchModel, BenchRequest, open_model
from tokenswift_cli.config import RunConfig, SamplingConfig
from tokenswift_cli.data import HELD_OUT_TEXT
from tokenswift_cli.engine.decode import generate
from tokenswift_cli.engine.state import prefill
from tokenswift_cli.sampling.defaults import PAPER

SAMPLINGS = {"greedy": SamplingConfig(), "paper": PAPER}
CHECKS = [("plain", None), ("auto", None), ("pass", None), ("verify", None)]  # (drafting, tree)
TIMED = [*CHECKS, ("pass", "3,3,3,3"), ("verify", "3,3,3,3")]


@dataclasses.dataclass(frozen=True)
class Sizes:
    prefix: int
    checked: int  # tokens of each exactness run
    timed: int  # tokens of each timed run


def opened(dry: bool, sizes: Sizes) -> BenchModel:
    request = BenchRequest(
        quick=dry, device="cpu" if dry else "cuda", dtype="float32" if dry else "bfloat16", weights="dense",
        prefix_file=HELD_OUT_TEXT, lengths=(sizes.timed,), length_context=sizes.prefix, contexts=(),
        sampling="greedy", context_window="none",
    )  # fmt: skip
    return open_model(request)


def config(model: BenchModel, sampling: str, drafting: str, tree: str | None, tokens: int) -> RunConfig:
    run = model.run.replace(max_new_tokens=tokens, sampling=SAMPLINGS[sampling])
    if drafting == "plain":
        return run.replace(mode="plain")
    draft = run.draft if tree is None else dataclasses.replace(run.draft, tree=tuple(map(int, tree.split(","))))
    return run.replace(mode="tokenswift", draft=draft.drafting(drafting))


def synced() -> float:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter()


def decode(model: BenchModel, cfg: RunConfig) -> tuple[list[int], float, Any]:
    """The run's new tokens, its decoding seconds (after the prefill) and its statistics."""
    state = prefill(model.target, model.prefix, cfg)
    heads = model.heads if cfg.mode == "tokenswift" else None
    if cfg.mode == "plain":
        state.partial = None
    start = synced()
    for _ in generate(model.target, heads, state, cfg):
        pass
    return list(state.generated[: cfg.max_new_tokens]), synced() - start, state.stats


def speed(model: BenchModel, sizes: Sizes) -> Iterator[dict[str, Any]]:
    for step, runs, tokens in (("exact", CHECKS, sizes.checked), ("speed", TIMED, sizes.timed)):
        for sampling in SAMPLINGS:
            plain: tuple[list[int], float] | None = None
            for drafting, tree in runs:
                cfg = config(model, sampling, drafting, tree, tokens)
                got, seconds, stats = decode(model, cfg)
                plain = plain or (got, seconds)
                where = first_divergence(got, plain[0])
                yield {
                    "step": step, "sampling": sampling, "drafting": drafting, "tree": tree or "1,3,3,3",
                    "tokens": len(got), "seconds": round(seconds, 4),
                    "ms_per_token": round(1000 * seconds / len(got), 3),
                    "tokens_per_step": round(stats.mean_accepted, 3), "iterations": stats.iterations,
                    "equal_to_plain": where is None, "first_divergence": where,
                    "speedup_over_plain": round(plain[1] / seconds, 3),
                    "phases_ms_per_token": {k: round(1000 * v / len(got), 3) for k, v in stats.seconds.items()},
                }  # fmt: skip


def profile(model: BenchModel, sizes: Sizes, *, scale: float = 1.0) -> Iterator[dict[str, Any]]:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as profiler

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    for drafting, steps in (("plain", int(48 * scale)), ("pass", int(16 * scale)), ("verify", int(16 * scale))):
        cfg = config(model, "greedy", drafting, None, (8 + steps) * 5)  # an iteration commits at most 5 tokens
        state = prefill(model.target, model.prefix, cfg)
        if cfg.mode == "plain":
            state.partial = None
        loop = generate(model.target, model.heads if cfg.mode == "tokenswift" else None, state, cfg)
        for _ in range(int(8 * scale)):  # graphs captured, tuner past its first probes
            next(loop)
        with profiler(activities=activities) as prof:
            start = synced()
            for _ in range(steps):
                next(loop)
            wall = synced() - start
        kernels = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
        busy = sum(e.self_device_time_total for e in kernels) / 1e6  # seconds the GPU ran kernels
        top = sorted(kernels, key=lambda e: -e.self_device_time_total)[:8]
        yield {
            "step": "profile", "drafting": drafting, "iterations": steps, "wall_ms": round(1000 * wall / steps, 3),
            "gpu_busy_ms": round(1000 * busy / steps, 3), "host_share": round(1 - busy / wall, 3) if wall else None,
            "kernels_per_iteration": round(sum(e.count for e in kernels) / steps, 1),
            "top_kernels": [
                (e.key[:80], round(e.self_device_time_total / 1000 / steps, 4), e.count // steps) for e in top
            ],
        }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("part", choices=("speed", "profile"))
    parser.add_argument("--out", type=Path, required=True, help="JSON lines, appended")
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args(argv)
    sizes = Sizes(prefix=64, checked=12, timed=24) if args.dry_run else Sizes(prefix=2048, checked=512, timed=1024)
    model = opened(args.dry_run, sizes)
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    parts = {"speed": speed, "profile": lambda m, s: profile(m, s, scale=0.125 if args.dry_run else 1.0)}
    with args.out.open("a") as out:
        for result in parts[args.part](model, sizes):
            line = json.dumps({"device": device, **result})
            print(line, flush=True)
            out.write(line + "\n")
            out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
