"""Cost of one decoding step with dense and 4-bit weights (`--weights int4`), interleaved in one process.

    python benchmarks/int4_weights.py --context 4096 --threads 1 [--window 4092] [--dtype float32]

Loads the embedded model twice (dense, then with 4-bit linear layers), prefills the first --context
tokens of a book into each, then times, alternately, a plain step (the root alone, then its logits)
and a forward of --nodes chained tokens; prints the median milliseconds and the ratio.
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
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--window", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    window = ContextWindow(size=args.window) if args.window else None
    models = {}
    for weights in ("dense", "int4"):
        loaded = load_model(ModelSpec(dtype=args.dtype, rope_scaling="none", weights=weights))  # type: ignore[arg-type]
        target = Target(loaded.model)
        tokens = loaded.tokenizer(BOOK.read_text(encoding="utf-8"))["input_ids"][: args.context]
        state = prefill(target, tokens, RunConfig(max_new_tokens=64, mode="plain", window=window))
        models[weights] = (target, state, torch.tensor(tokens[-args.nodes :]))
    times: dict[tuple[str, int], list[float]] = {}
    for _ in range(args.repeats):
        for weights, (target, state, chain) in models.items():
            for rows in (1, args.nodes):
                start = time.perf_counter()
                forward = target.forward(chain[:rows], state.full, exact=True)
                target.logits(forward.hidden[-1:])
                times.setdefault((weights, rows), []).append(time.perf_counter() - start)
    print(f"context {args.context}, window {args.window}, {args.dtype}, {args.threads} thread(s): median ms")
    print("| rows | dense | int4 | dense / int4 |")
    print("| --- | --- | --- | --- |")
    for rows in (1, args.nodes):
        dense, int4 = (1000 * statistics.median(times[(w, rows)]) for w in ("dense", "int4"))
        print(f"| {rows} | {dense:.1f} | {int4:.1f} | {dense / int4:.2f} |")


if __name__ == "__main__":
    main()
