"""One forward of the embedded 4-bit model three ways, interleaved in one process: every layer in one
C++ call (`native_decoder.py`, the default), the layers in Python with the C++ row-attention kernel,
and the layers in Python with the torch exact attention (`exact_float32.py`).

    python benchmarks/row_kernel.py --context 8192 --window 4092 --threads 1

Prefills the first --context tokens of a book, then times, alternately, a plain step (the root
alone, then its logits) and a forward of --nodes chained tokens each way; prints the median
milliseconds and the ratios to the first.
"""

from __future__ import annotations

import argparse
import statistics
import time

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
    native = target.native
    ways = {"C++ layers": (native, True), "Python + kernel": (None, True), "Python + torch": (None, False)}
    times: dict[tuple[str, int], list[float]] = {}
    for _ in range(args.repeats):
        for way, (decoder, kernel) in ways.items():
            target.backend.native, target.backend.row_kernel = decoder, kernel
            for rows in (1, args.nodes):
                start = time.perf_counter()
                forward = target.forward(chain[:rows], state.full, exact=True)
                target.logits(forward.hidden[-1:])
                times.setdefault((way, rows), []).append(time.perf_counter() - start)
    print(f"context {args.context}, window {args.window}, {args.threads} thread(s): median ms")
    print("| rows | " + " | ".join(ways) + " |")
    print("| --- |" + " --- |" * len(ways))
    for rows in (1, args.nodes):
        first, *rest = (1000 * statistics.median(times[(way, rows)]) for way in ways)
        print(f"| {rows} | {first:.1f} | " + " | ".join(f"{t:.1f} ({t / first:.2f}x)" for t in rest) + " |")


if __name__ == "__main__":
    main()
