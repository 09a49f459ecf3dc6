"""A plain step with one and two threads, on an idle machine and with another process busy on one core.

On a 2-core laptop a browser or a build often holds one core. Work split between two threads must then
not wait, at every split, for a thread the scheduler runs late (issue 41: with OpenMP's fork/join, 200
tokens took 350 s with two threads against 37 s with one, under load 5-6). Loads the embedded model as
`tokenswift write` does, prefills --context tokens of the held-out prefix, then times the plain step
(forward and head row over the cache) in turns: threads 1 and 2, each without and with a busy process
(`python -c "while True: pass"`, started for its turn and stopped after). Prints a table, writes JSON.

    python benchmarks/threads_busy.py --context 2048 --steps 40 --rounds 3 --out benchmarks/results/threads/busy.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from step_bounds import prefilled_plain_step  # beside this file


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--context", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=40, help="steps timed per turn")
    parser.add_argument("--rounds", type=int, default=3, help="turns of each case")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    load = os.getloadavg()
    _, step = prefilled_plain_step(args.context)
    cases = [(threads, busy) for busy in (False, True) for threads in (1, 2)]
    seconds: dict[tuple[int, bool], list[float]] = {case: [] for case in cases}
    for _ in range(args.rounds):
        for threads, busy in cases:
            torch.set_num_threads(threads)
            hog = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
            try:
                time.sleep(0.2 if busy else 0.0)
                step()  # the threads wake
                for _ in range(args.steps):
                    start = time.perf_counter()
                    step()
                    seconds[threads, busy].append(time.perf_counter() - start)
            finally:
                if hog:
                    hog.kill()
                    hog.wait()
    rows = []
    print(f"context {args.context}, load average before {load[0]:.2f}, {os.cpu_count()} cores")
    print(f"{'threads':>7} {'other process':>14} {'median ms':>10} {'p90 ms':>8} {'tokens/s':>9}")
    for threads, busy in cases:
        times = sorted(seconds[threads, busy])
        median, p90 = statistics.median(times) * 1e3, times[int(0.9 * (len(times) - 1))] * 1e3
        rows.append({"threads": threads, "busy_core": busy, "median_ms": median, "p90_ms": p90, "steps": len(times)})
        print(f"{threads:>7} {'busy' if busy else 'none':>14} {median:10.2f} {p90:8.2f} {1e3 / median:9.1f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result = {
        "command": " ".join(["python benchmarks/threads_busy.py", *(f"--{k} {v}" for k, v in vars(args).items())]),
        "load_before": load, "load_after": os.getloadavg(), "rows": rows,
    }  # fmt: skip
    args.out.write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
