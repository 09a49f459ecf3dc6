"""Plain decoding step at a long context with split-KV attention on and off, interleaved in one process.

    .venv/bin/python benchmarks/split_kv.py --threads 2 --dtype float32 --context 16384

Split-KV (attention.py) cuts a long cache into chunks so that several threads share the attention
of the 3 KV heads; with one thread it is off. Prints the median step time of each setting.
"""

from __future__ import annotations

import argparse
import time

import torch

from tokenswift_cli.config import ModelSpec
from tokenswift_cli.data import DEFAULT_TEXT
from tokenswift_cli.model import attention
from tokenswift_cli.model.cache import FullCache
from tokenswift_cli.model.loading import load_model
from tokenswift_cli.model.target import Target

PREFIX = DEFAULT_TEXT


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--context", type=int, default=16384)
    parser.add_argument("--steps", type=int, default=12)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load_model(ModelSpec(dtype=args.dtype), total_tokens=args.context + args.steps + 1)  # type: ignore[arg-type]
    target = Target(loaded.model)
    ids = loaded.tokenizer(PREFIX.read_text(encoding="utf-8"))["input_ids"]
    ids = (ids * (1 + (args.context + args.steps) // len(ids)))[: args.context + args.steps]
    cache = FullCache(target.num_layers, capacity=args.context + args.steps + 8)
    for start in range(0, args.context, 512):
        chunk = torch.tensor(ids[start : min(start + 512, args.context)])
        target.forward(chunk, cache)
        cache.commit(range(chunk.shape[0]))
    times: dict[str, list[float]] = {"split": [], "one call": []}
    for step in range(args.steps):  # one token per step, both settings on the same cache
        order = ("split", "one call") if step % 2 == 0 else ("one call", "split")
        for mode in order:
            attention.SPLIT_KV_MIN = 4096 if mode == "split" else 1 << 40
            began = time.perf_counter()
            target.logits(target.forward(torch.tensor([ids[args.context + step]]), cache).hidden[-1])
            times[mode].append(time.perf_counter() - began)
    for mode, values in times.items():
        print(f"{args.context} tokens, {args.dtype}, {args.threads} threads, {mode}: "
              f"{1000 * sorted(values)[len(values) // 2]:.1f} ms per step (median of {len(values)})")  # fmt: skip


if __name__ == "__main__":
    main()
