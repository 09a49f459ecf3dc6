"""The target's scores and draw per token: the torch definition against the fused C++ kernel (issue 41, item 1).

Records the rows the acceptance walk scores in a plain run of the embedded model (held-out prose
prefix, every default, 4K window), then times both ways on each recorded row, taking turns in one
process (the machine is shared: the ratio is what holds), checks that both draw the same tokens,
and times the rest of the accept phase beside them: the output head's row and the context tensor.

    python benchmarks/target_scores.py --tokens 300 --repeats 5 --threads 1 \
        --out benchmarks/results/sampler/target-scores.json

--threads sets torch's threads (the run's default: the cores). On a loaded shared machine torch's
parallel ops (and the head) wait on each other's threads far longer than alone: one thread shows the
definition at its best.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import statistics
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from tokenswift_cli.bench.harness import Bench
from tokenswift_cli.bench.models import BenchRequest, open_model
from tokenswift_cli.engine import verify
from tokenswift_cli.engine.decode import generate
from tokenswift_cli.engine.state import prefill
from tokenswift_cli.sampling import distribution, fused


def record(tokens: int, context: int) -> tuple[list[tuple[torch.Tensor, torch.Tensor, int]], Any, Any]:
    """The (logits row, context, position) of every draw of a plain run, the run's config and target."""
    request = BenchRequest(
        lengths=(tokens,), length_context=context, contexts=(), methods=("plain",), sampling="default",
        context_window="4k",
    )  # fmt: skip
    model = open_model(request)
    bench = Bench(model.target, None, request.settings(model.run))
    case = request.cases()[0]
    cfg = bench.config("plain", case)
    state = prefill(model.target, model.prefix[: case.context], cfg)
    state.partial = None
    rows: list[tuple[torch.Tensor, torch.Tensor, int]] = []
    original = verify.choose

    def recording(logits: torch.Tensor, ctx: torch.Tensor, position: int, sampling: Any) -> int:
        rows.append((logits.clone(), ctx.clone(), position))
        return original(logits, ctx, position, sampling)

    verify.choose = recording  # type: ignore[assignment]
    try:
        for _ in generate(model.target, None, state, cfg):
            pass
    finally:
        verify.choose = original  # type: ignore[assignment]
    return rows, cfg, model.target


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def milliseconds(seconds: list[float]) -> dict[str, float]:
    ordered = sorted(seconds)
    return {
        "median_ms": statistics.median(ordered) * 1e3,
        "mean_ms": statistics.fmean(ordered) * 1e3,
        "p90_ms": ordered[int(0.9 * len(ordered))] * 1e3,
    }


def reference(logits: torch.Tensor, ctx: torch.Tensor, position: int, cfg: Any) -> int:
    os.environ[fused.FUSED] = "0"
    try:
        return distribution.choose(logits, ctx, position, cfg)
    finally:
        del os.environ[fused.FUSED]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=300)
    parser.add_argument("--context", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    load = os.getloadavg()
    rows, cfg, target = record(args.tokens, args.context)
    sampling = cfg.sampling
    codes: Counter[str] = Counter()
    run = fused.run

    def counting(*a: Any, **k: Any) -> Any:
        result = run(*a, **k)
        codes[
            "torch (unhandled)" if result is None else {-1: "full CDF", -2: "min-p by torch"}.get(result[1], "kernel")
        ] += 1
        return result

    fused.run = counting  # type: ignore[assignment]
    times: dict[str, list[float]] = {"definition (torch)": [], "fused kernel": [], "head row": [], "context tensor": []}
    mismatches = 0
    hidden = torch.randn(1, target.model.config.hidden_size)
    history = list(range(args.context + args.tokens))
    for repeat in range(args.repeats):
        codes.clear()
        for index, (logits, ctx, position) in enumerate(rows):
            ways = [("definition (torch)", reference), ("fused kernel", distribution.choose)]
            if (index + repeat) % 2:
                ways.reverse()  # taking turns: neither way always runs first
            drawn = []
            for name, way in ways:
                seconds, token = timed(functools.partial(way, logits, ctx, position, sampling))
                times[name].append(seconds)
                drawn.append(token)
            mismatches += drawn[0] != drawn[1]
            times["head row"].append(timed(lambda: target.logits(hidden))[0])
            tail = history[-sampling.context_length :]
            times["context tensor"].append(timed(functools.partial(torch.tensor, tail + [1], dtype=torch.long))[0])
    fused.run = run  # type: ignore[assignment]
    summary = {name: milliseconds(v) for name, v in times.items()}
    ratio = summary["definition (torch)"]["median_ms"] / summary["fused kernel"]["median_ms"]
    print(f"{len(rows)} draws x {args.repeats} repeats; load average before: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(f"{'':24} {'median ms':>10} {'mean ms':>10} {'p90 ms':>10}")
    for name, row in summary.items():
        print(f"{name:24} {row['median_ms']:10.3f} {row['mean_ms']:10.3f} {row['p90_ms']:10.3f}")
    print(f"definition / fused (medians): {ratio:.1f}x; tokens differing: {mismatches}")
    print(f"how the last repeat's draws were settled: {dict(codes)}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result = {
        "command": "python benchmarks/target_scores.py " + " ".join(f"--{k} {v}" for k, v in vars(args).items()),
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(), "load_before": load,
                    "load_after": os.getloadavg(), "torch": torch.__version__, "threads": torch.get_num_threads()},
        "sampling": sampling.to_dict(), "draws": len(rows), "repeats": args.repeats, "summary": summary,
        "ratio_of_medians": ratio, "tokens_differing": mismatches, "draws_by_way": dict(codes),
    }  # fmt: skip
    args.out.write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
