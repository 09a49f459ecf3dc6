"""Two source trees' plain step, side by side: two worker processes take turns, so a burst of load hits
both alike (compare the ratio, not the milliseconds).

Each worker imports `tokenswift_cli` from its own tree (PYTHONPATH), loads the embedded model as
`tokenswift write` does, prefills --context tokens (step_bounds.py's `prefilled_plain_step`) and times
20 plain steps whenever asked. Prints the medians and new/old, writes JSON.

    git worktree add /tmp/old COMMIT
    python benchmarks/step_ab.py --old /tmp/old/src --new src --context 4096 --threads 1 --rounds 24 --out ab.json
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

HERE = Path(__file__).resolve().parent


def worker(context: int, threads: int) -> None:
    import torch

    sys.path.insert(0, str(HERE))
    from step_bounds import prefilled_plain_step

    torch.set_num_threads(threads)
    _, step = prefilled_plain_step(context)
    for _ in range(10):
        step()
    print("ready", flush=True)
    for line in sys.stdin:
        count = int(line)
        start = time.perf_counter()
        for _ in range(count):
            step()
        print((time.perf_counter() - start) / count, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", type=Path, required=True, help="the old tree's src folder")
    parser.add_argument("--new", type=Path, required=True, help="the new tree's src folder")
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=24)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.context, args.threads)
    workers = {}
    for side in ("old", "new"):
        env = dict(os.environ, PYTHONPATH=str(getattr(args, side).resolve()))
        command = [sys.executable, __file__, "--worker", "--old", ".", "--new", ".", "--out", "-",
                   "--context", str(args.context), "--threads", str(args.threads)]  # fmt: skip
        workers[side] = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        assert workers[side].stdout is not None and workers[side].stdout.readline().strip() == "ready"
    seconds: dict[str, list[float]] = {"old": [], "new": []}
    load = os.getloadavg()
    for turn in range(args.rounds):
        for side in ("old", "new") if turn % 2 == 0 else ("new", "old"):
            process = workers[side]
            assert process.stdin is not None and process.stdout is not None
            process.stdin.write("20\n")
            process.stdin.flush()
            seconds[side].append(float(process.stdout.readline()))
    for process in workers.values():
        assert process.stdin is not None
        process.stdin.close()
        process.wait()
    ratios = sorted(n / o for n, o in zip(seconds["new"], seconds["old"], strict=True))
    result = {
        "command": " ".join(sys.argv),
        "load_before": load,
        "old_ms": statistics.median(seconds["old"]) * 1e3,
        "new_ms": statistics.median(seconds["new"]) * 1e3,
        "new_over_old": statistics.median(ratios),
        "iqr": [ratios[len(ratios) // 4], ratios[3 * len(ratios) // 4]],
        "seconds": seconds,
    }
    print(
        f"context {args.context}, {args.threads} thread(s): old {result['old_ms']:.2f} ms, "
        f"new {result['new_ms']:.2f} ms, new/old {result['new_over_old']:.3f} "
        f"(IQR {result['iqr'][0]:.3f}-{result['iqr'][1]:.3f}), {args.rounds} rounds"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
