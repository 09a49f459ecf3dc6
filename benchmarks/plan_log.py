"""Which plan `--draft auto` ran at each step, and what each cost, beside plain decoding in one process.

    python benchmarks/plan_log.py --context 8192 --tokens 512 --window 4k --sampling paper --threads 1

Prefills the first --context tokens of Milton with the bench's model (4-bit weights, float32), then
runs plain decoding and TokenSwift (`--draft auto`) on copies of that state, taking turns over
--repeats. Prints the time of each, both methods' phases in ms per step ("loop": the loop's own
bookkeeping, outside the phases), and per plan: steps,
tokens, seconds in plain steps (the median plain step of the plain run) and the excess over one
plain step per token; then the first steps' plans.
"""

from __future__ import annotations

import argparse
import collections
import statistics

import torch

from tokenswift_cli.bench.harness import Bench
from tokenswift_cli.bench.models import BenchRequest, open_model
from tokenswift_cli.engine.auto import tuner as autotune
from tokenswift_cli.engine.state import prefill


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--context", type=int, default=8192)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--window", default="4k", help="none, or a size such as 4k")
    parser.add_argument("--sampling", default="paper", help="paper or greedy")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    request = BenchRequest(dtype="float32", weights="int4", lengths=(), contexts=(args.context,),
                           context_tokens=args.tokens, methods=("plain", "tokenswift"), sampling=args.sampling,
                           context_window=args.window)  # fmt: skip
    opened = open_model(request)
    settings = request.settings(opened.run)
    bench, case = Bench(opened.target, opened.heads, settings), settings.cases[0]
    prefilled = prefill(opened.target, opened.prefix[: case.context], bench.config("tokenswift", case))

    steps: list[tuple[str, int, float]] = []  # (plan, tokens, seconds) of every step
    record = autotune.Tuner.record

    def logged(self: autotune.Tuner, plan: autotune.Plan, tokens: int, seconds: float, rows: int = 1) -> None:
        steps.append((plan.name, tokens, seconds))
        record(self, plan, tokens, seconds, rows)

    autotune.Tuner.record = logged  # type: ignore[method-assign]
    seconds: dict[str, list[float]] = collections.defaultdict(list)
    logs: dict[str, list[tuple[str, int, float]]] = {}
    phases: dict[str, dict[str, float]] = collections.defaultdict(lambda: collections.defaultdict(float))
    steps_run: dict[str, int] = collections.Counter()
    for repeat in range(args.repeats):
        for method in ("plain", "tokenswift") if repeat % 2 == 0 else ("tokenswift", "plain"):
            steps.clear()
            run = bench._engine(method, case, prefilled)
            seconds[method].append(run.seconds)
            logs[method] = list(steps)
            for name, value in run.stats.seconds.items():
                phases[method][name] += value
            phases[method]["loop"] += run.seconds - run.stats.decode_seconds
            steps_run[method] += run.stats.iterations
    unit = statistics.median(s for _, _, s in logs["plain"])
    plain, fast = sum(seconds["plain"]), sum(seconds["tokenswift"])
    print(f"plain {plain:.2f} s, TokenSwift {fast:.2f} s: {plain / fast:.3f}x; a plain step {1000 * unit:.1f} ms")
    print("| ms per step | " + " | ".join(phases["plain"]) + " |")
    print("| --- " * (1 + len(phases["plain"])) + "|")
    for method in ("plain", "tokenswift"):
        per_step = [1000 * phases[method][name] / steps_run[method] for name in phases["plain"]]
        print(f"| {method} | " + " | ".join(f"{ms:.2f}" for ms in per_step) + " |")
    print("| plan | steps | tokens | plain steps' time | excess |")
    print("| --- | --- | --- | --- | --- |")
    by_plan: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0, 0.0])
    for name, tokens, step_seconds in logs["tokenswift"]:
        by_plan[name][0] += 1
        by_plan[name][1] += tokens
        by_plan[name][2] += step_seconds
    for name, (count, tokens, total) in by_plan.items():
        print(f"| {name} | {count:.0f} | {tokens:.0f} | {total / unit:.1f} | {(total - tokens * unit) / unit:+.1f} |")
    print("first 40 steps:", " ".join(name for name, _, _ in logs["tokenswift"][:40]))


if __name__ == "__main__":
    main()
