"""One forward of the embedded 4-bit model with the C++ row-attention kernel and with the torch exact
attention (`exact_float32.py`), interleaved in one process.

    python benchmarks/row_kernel.py --context 8192 --window 4092 --threads 1

Prefills the first --context tokens of a book, then times, alternately, a plain step (the root
alone, then its logits) and a forward of --nodes chained tokens with `target.row_kernel` on and off;
prints the median milliseconds and the ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from tokenswift_cli.config import ContextWindow, ModelSpec, RunConfig
from tokenswift_cli.loading import load_model
from tokenswift_cli.state import prefill
from tokenswift_cli.target import Target

BOOK = Path(__file__).resolve().parents[2] / "shared" / "data" / "prefixes" / "milton-paradise-lost.txt"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--context", type=int, default=8192)
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--window", type=int, default=4092)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load_model(ModelSpec(dtype="float32", rope_scaling="none", weights="int4"))
    target = Target(loaded.model)
    tokens = loaded.tokenizer(BOOK.read_text(encoding="utf-8"))["input_ids"][: args.context]
    window = ContextWindow(size=args.window) if args.window else None
    state = prefill(target, tokens, RunConfig(max_new_tokens=64, mode="plain", window=window))
    chain = torch.tensor(tokens[-args.nodes :])
    times: dict[tuple[bool, int], list[float]] = {}
    for _ in range(args.repeats):
        for kernel in (True, False):
            target.row_kernel = kernel
            for rows in (1, args.nodes):
                start = time.perf_counter()
                forward = target.forward(chain[:rows], state.full, exact=True)
                target.logits(forward.hidden[-1:])
                times.setdefault((kernel, rows), []).append(time.perf_counter() - start)
    print(f"context {args.context}, window {args.window}, {args.threads} thread(s): median ms")
    print("| rows | kernel | torch exact | ratio |")
    print("| --- | --- | --- | --- |")
    for rows in (1, args.nodes):
        kernel, torch_exact = (1000 * statistics.median(times[(k, rows)]) for k in (True, False))
        print(f"| {rows} | {kernel:.1f} | {torch_exact:.1f} | {torch_exact / kernel:.2f} |")


if __name__ == "__main__":
    main()
