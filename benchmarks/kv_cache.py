"""A step of the embedded 4-bit model over a float32, a float16 and an 8-bit KV cache, taking turns in one process.

    python benchmarks/kv_cache.py --contexts 8192,32768 --window 0 --threads 1 --out kv-cache.json

Prefills the first N tokens of a book once (float32 storage), copies the cache into float16 and 8-bit
storage (rounded as a run would store it: `--kv-cache float16`, `int8`), then times, taking turns on
each cache, a plain step (one token and its logits) and a forward of --nodes chained tokens (a tree's
verification). Prints the median milliseconds, the ratios to float16 (the default), the cache's bytes,
and writes them as JSON.
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
from tokenswift_cli.engine.state import full_capacity, prefill
from tokenswift_cli.model import kv_rows
from tokenswift_cli.model.cache import FullCache
from tokenswift_cli.model.loading import load_model
from tokenswift_cli.model.target import Target

BOOK = DEFAULT_TEXT


STORAGES = {"float32": torch.float32, "float16": torch.float16, "int8": kv_rows.STORAGE}


def narrowed(full: FullCache, cfg: RunConfig, prefix: int, dtype: torch.dtype) -> FullCache:
    """A copy of `full` stored in `dtype`, with the same capacity and window."""
    copy = FullCache(len(full.layer_list), full_capacity(cfg, prefix), window=full.window, dtype=dtype)
    for start, end in full.held():
        if start > copy.length:
            copy.skip_to(start)
        for index in range(len(full.layer_list)):
            copy.load_segment(index, *full.segment(index, start, end))
    return copy


def cache_bytes(full: FullCache) -> int:
    """The rows' bytes, and an 8-bit cache's tiles (the same bits laid out for the kernel)."""
    rows = sum(layer.keys.nbytes + layer.values.nbytes for layer in full.layer_list)  # type: ignore[union-attr]
    return rows + sum(tiles[0].nbytes for layer in full.layer_list if (tiles := layer.tiles()) is not None)


def measure(target: Target, tokens: list[int], window: ContextWindow | None, nodes: int, repeats: int) -> dict:
    cfg = RunConfig(max_new_tokens=64, mode="plain", window=window, kv_cache="model")
    state = prefill(target, tokens, cfg)
    caches = {
        name: state.full if dtype == torch.float32 else narrowed(state.full, cfg, len(tokens), dtype)
        for name, dtype in STORAGES.items()
    }
    chain = torch.tensor(tokens[-nodes:])
    times: dict[tuple[str, int], list[float]] = {}
    for _ in range(repeats):
        for name, cache in caches.items():
            for rows in (1, nodes):
                start = time.perf_counter()
                forward = target.forward(chain[:rows], cache, exact=True)
                target.logits(forward.hidden[-1:])
                times.setdefault((name, rows), []).append(time.perf_counter() - start)
    medians = {f"{name} x{rows}": 1000 * statistics.median(t) for (name, rows), t in times.items()}
    return {
        "context": len(tokens),
        "window": window.size if window else None,
        "median_ms": medians,
        "cache_mib": {name: cache_bytes(cache) / 2**20 for name, cache in caches.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", default="8192,32768")
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--window", type=int, default=0, help="context window size (0: full context)")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load_model(ModelSpec(dtype="float32", rope_scaling="none", weights="int4"))
    target = Target(loaded.model)
    assert target.native is not None, "the native decoder did not build"
    book = loaded.tokenizer(BOOK.read_text(encoding="utf-8"))["input_ids"]
    window = ContextWindow(size=args.window) if args.window else None
    results = []
    print(f"{args.threads} thread(s), window {args.window or 'none'}: median ms per forward (+ logits)")
    print("| context | rows | float32 KV | float16 KV | int8 KV | float16 / float32 | int8 / float16 |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for context in (int(c) for c in args.contexts.split(",")):
        result = measure(target, book[:context], window, args.nodes, args.repeats)
        results.append(result)
        for rows in (1, args.nodes):
            wide, narrow, q8 = (result["median_ms"][f"{name} x{rows}"] for name in STORAGES)
            ratios = f"{narrow / wide:.3f} | {q8 / narrow:.3f}"
            print(f"| {context} | {rows} | {wide:.1f} | {narrow:.1f} | {q8:.1f} | {ratios} |", flush=True)
        print(f"cache at {context}: " + ", ".join(f"{k} {v:.0f} MiB" for k, v in result["cache_mib"].items()))
    if args.out:
        args.out.write_text(json.dumps({"threads": args.threads, "nodes": args.nodes, "results": results}, indent=1))


if __name__ == "__main__":
    main()
