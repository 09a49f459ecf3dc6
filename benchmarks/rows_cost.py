"""What a verification forward costs by the number of tokens it verifies, interleaved in one process.

    python benchmarks/rows_cost.py --context 8192 --window 4092 --rows 1,2,4,8,12,16,24,32 --threads 2

Prefills the first --context tokens of a book with the run's defaults (4-bit weights, float16 KV
cache, the window unless --window 0), then times, taking turns, forwards of a chain of R tokens with
the logits of every row, as a chain draft's verification does. Prints the median milliseconds, the
ratio to one row (a plain step), and the tokens per step a chain of R must commit to break even;
writes them as JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from tokenswift_cli.config import ContextWindow, ModelSpec, RunConfig
from tokenswift_cli.data import DEFAULT_TEXT
from tokenswift_cli.engine.state import prefill
from tokenswift_cli.model.loading import load_model
from tokenswift_cli.model.target import Target

BOOK = DEFAULT_TEXT


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--context", type=int, default=8192)
    parser.add_argument("--window", type=int, default=4092, help="0: full context")
    parser.add_argument("--rows", default="1,2,4,8,12,16,24,32")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = [int(r) for r in args.rows.split(",")]
    loaded = load_model(ModelSpec(dtype="float32", weights="int4"), total_tokens=args.context + 64)
    target = Target(loaded.model)
    tokens = loaded.tokenizer(BOOK.read_text(encoding="utf-8"))["input_ids"][: args.context]
    window = ContextWindow(size=args.window) if args.window else None
    state = prefill(target, tokens, RunConfig(max_new_tokens=64, mode="plain", window=window))
    chain = torch.tensor(tokens[-max(rows) :])
    times: dict[int, list[float]] = {r: [] for r in rows}
    with torch.no_grad():
        for _ in range(args.repeats):
            for r in rows:
                start = time.perf_counter()
                forward = target.forward(chain[:r], state.full, exact=True)
                target.logits(forward.hidden)
                times[r].append(time.perf_counter() - start)
    one = statistics.median(times[rows[0]])
    result = {
        "context": args.context, "window": args.window, "threads": args.threads,
        "kv_storage": str(state.full.storage_dtype), "ms": {r: 1000 * statistics.median(t) for r, t in times.items()},
    }  # fmt: skip
    print(
        f"context {args.context}, window {args.window or 'none'}, {args.threads} threads, KV {state.full.storage_dtype}"
    )
    print("| rows | ms | x one row |")
    print("| --- | --- | --- |")
    for r, t in times.items():
        print(f"| {r} | {1000 * statistics.median(t):.1f} | {statistics.median(t) / one:.2f} |")
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
