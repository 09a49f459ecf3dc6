"""Cost of the batch-invariant (exact) bfloat16 verification against the fast path, interleaved.

    python benchmarks/exact_attention.py --context 4096 --threads 1 [--window 4092] [--float32]

Prefills the first --context tokens of a book, then times, alternately, one verification forward of
the root alone (a plain step) and of a chain of --nodes tokens, with exact=True and exact=False;
prints the median milliseconds of each. Nothing is committed: every forward writes the same scratch rows.
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
    parser.add_argument("--float32", action="store_true", help="Also time the float32 fast path (the default dtype).")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load_model(ModelSpec(dtype="bfloat16", rope_scaling="none"))
    target = Target(loaded.model)
    tokens = loaded.tokenizer(BOOK.read_text(encoding="utf-8"))["input_ids"][: args.context]
    window = ContextWindow(size=args.window) if args.window else None
    state = prefill(target, tokens, RunConfig(max_new_tokens=64, mode="plain", window=window))
    chain = torch.tensor(tokens[-args.nodes :])
    times: dict[str, list[float]] = {}
    for _ in range(args.repeats):
        for rows in (1, args.nodes):
            for exact in (False, True):
                start = time.perf_counter()
                target.forward(chain[:rows], state.full, exact=exact)
                times.setdefault(f"{rows} row(s), exact={exact}", []).append(time.perf_counter() - start)
    if args.float32:
        target32 = Target(load_model(ModelSpec(dtype="float32", rope_scaling="none")).model)
        state32 = prefill(target32, tokens, RunConfig(max_new_tokens=64, mode="plain", window=window))
        for _ in range(args.repeats):
            for rows in (1, args.nodes):
                start = time.perf_counter()
                target32.forward(chain[:rows], state32.full)
                times.setdefault(f"{rows} row(s), float32", []).append(time.perf_counter() - start)
    for name, values in times.items():
        print(f"{name}: {1000 * statistics.median(values):.1f} ms")


if __name__ == "__main__":
    main()
