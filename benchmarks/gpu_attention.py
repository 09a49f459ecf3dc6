"""The exact attention of one layer on a GPU: the Triton kernels against the torch version (`float64_attention`).

For the embedded model's heads (9 over 3 KV heads, head_dim 64) and Llama-3.1-8B's (32 over 8, 128), at
several cache lengths, a plain step's one row and a 64-node verification: milliseconds of the kernels
with their products in registers, on float64 tensor cores (`dot`), and of the torch version (CUDA graphs
of 10 calls, so launches do not count), whether their bits agree, and the bytes the kernels must read
over the copy bandwidth (the floor).

    python benchmarks/gpu_attention.py --out $OUT/attention.json      # on the GPU machine
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import torch

if not torch.cuda.is_available():  # --dry-run on a CPU: the kernels interpreted
    os.environ.setdefault("TRITON_INTERPRET", "1")

from tokenswift_cli.backends.cuda.attention_kernel import kernel_attention
from tokenswift_cli.backends.cuda.float64_attention import float64_attention

HEADS = {"embedded": (9, 3, 64), "llama-3.1-8b": (32, 8, 128)}
REPEATS = 10
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def graphed_ms(fn: Any) -> float:
    """Milliseconds per call of `fn`, replayed from a CUDA graph of `REPEATS` calls (on a CPU: one call)."""
    if DEVICE == "cpu":
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1000
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for _ in range(REPEATS):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(3):
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / REPEATS)
    return sorted(times)[len(times) // 2]


def case(name: str, held: int, rows: int, bandwidth: float) -> dict[str, Any]:
    heads, kv, dim = HEADS[name]
    generator = torch.Generator(device=DEVICE).manual_seed(held + rows)
    query = torch.randn(1, heads, rows, dim, device=DEVICE, generator=generator).bfloat16()
    keys = torch.randn(1, kv, held + 64, dim, device=DEVICE, generator=generator).bfloat16()
    values = torch.randn(1, kv, held + 64, dim, device=DEVICE, generator=generator).bfloat16()
    visible = torch.ones(rows, rows, dtype=torch.bool, device=DEVICE).tril()
    count = torch.tensor(held, device=DEVICE)

    def kernels() -> torch.Tensor:
        return kernel_attention(query, keys, values, count, tree_visible=visible, scaling=dim**-0.5)

    def dot_kernels() -> torch.Tensor:
        return kernel_attention(query, keys, values, count, tree_visible=visible, scaling=dim**-0.5, dot=True)

    def torch_version() -> torch.Tensor:
        return float64_attention(
            query, keys[:, :, :held], values[:, :, :held], keys[:, :, held : held + rows],
            values[:, :, held : held + rows], tree_visible=visible, scaling=dim**-0.5,
        )  # fmt: skip

    expected = torch_version()
    equal, dot_equal = torch.equal(kernels(), expected), torch.equal(dot_kernels(), expected)
    floor_ms = 2 * kv * (held + rows) * dim * 2 / (bandwidth * 1e9) * 1000  # keys and values, bf16, read once
    # the register products at 64 rows and long caches took minutes in all (the H200 run of 2026-11-27):
    # timed to 16K only
    slow = rows > 4 and held > 16384
    kernel_ms = float("nan") if slow else graphed_ms(kernels)
    dot_ms, torch_ms = graphed_ms(dot_kernels), graphed_ms(torch_version)
    return {"heads": name, "held": held, "rows": rows, "kernel_ms": kernel_ms, "dot_ms": dot_ms, "torch_ms": torch_ms,
            "speedup": torch_ms / min(dot_ms, kernel_ms if kernel_ms == kernel_ms else dot_ms), "floor_ms": floor_ms,
            "equal": equal, "dot_equal": dot_equal}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="2048,16384,65536")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--dry-run", action="store_true", help="short caches on any device: the script's logic")
    args = parser.parse_args()
    if args.dry_run:
        args.lengths = "64"
    source = torch.randn(2**28 if DEVICE == "cuda" else 2**16, device=DEVICE)
    target = torch.empty_like(source)
    target.copy_(source)
    bandwidth = 1.0
    if DEVICE == "cuda":
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(5):
            target.copy_(source)
        end.record()
        torch.cuda.synchronize()
        bandwidth = 2 * source.numel() * 4 * 5 / (start.elapsed_time(end) / 1000) / 1e9
    del source, target
    rows: list[dict[str, Any]] = []
    gpu = torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu"
    print(f"copy {bandwidth:.0f} GB/s; {gpu}")
    print(f"{'heads':<13} {'held':>6} {'rows':>4} {'kernel ms':>10} {'dot ms':>8} {'torch ms':>9} {'x best':>6} "
          f"{'floor ms':>9} equal")  # fmt: skip
    for name in HEADS:
        for held in (int(n) for n in args.lengths.split(",")):
            for count in (1, 64):
                row = case(name, held, count, bandwidth)
                rows.append(row)
                print(f"{name:<13} {held:>6} {count:>4} {row['kernel_ms']:>10.3f} {row['dot_ms']:>8.3f} "
                      f"{row['torch_ms']:>9.3f} {row['speedup']:>6.1f} {row['floor_ms']:>9.4f} "
                      f"{row['equal']}/{row['dot_equal']}", flush=True)  # fmt: skip
                args.out.write_text(json.dumps({"gpu": gpu, "copy_gb_s": bandwidth,
                                                "rows": rows}, indent=1) + "\n", encoding="utf-8")  # fmt: skip
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
