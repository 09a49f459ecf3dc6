"""A plain step's attention in three arithmetics, side by side in one process (issue 41): the engine's
kernel (float32 over the float16 cache), bfloat16 dot products over bfloat16 tiles, and 8-bit integer
dot products over an 8-bit cache (benchmarks/attention_prototypes.cpp says how each stores and
computes), plus a pass that only reads the float16 cache's bytes (the memory floor of that layout).

    python benchmarks/attention_prototypes.py --context 4096 --threads 2 --repeats 41 \\
        --out benchmarks/results/kv-cache/attention-prototypes-2threads.json

Random keys, values and query (the embedded model's shape: 30 layers, 3 KV heads of 64, 3 query heads
each), every position seen. Prints each one's relative error against float64 attention over the
float16 cache, and the milliseconds for 30 layers, taking turns, with each one's ratio to the engine's
(median and quartiles over the rounds). Needs AVX-512 with bf16 and VNNI.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch.utils import cpp_extension

from tokenswift_cli.backends.cpu import kernels
from tokenswift_cli.backends.cpu.row_attention import RowLayout
from tokenswift_cli.model import kv_rows

ROOT = Path(__file__).resolve().parents[1]
CSRC = ROOT / "src/tokenswift_cli/backends/cpu/csrc"
LAYERS, KV, GROUP, DIM, BLOCK = 30, 3, 3, 64, 256


def q8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`x` `[kv, n, 64]` as the engine's 8-bit cache rounds it (kv_rows.pack): levels (int8) and a float32
    scale per 32 values `[kv, n, 2]`."""
    packed = kv_rows.pack(x)
    return packed[..., :DIM].contiguous().view(torch.int8), packed[..., DIM:].contiguous().view(torch.float32)


def key_tiles_8bit(keys: torch.Tensor) -> torch.Tensor:
    """Tiles `[kv, n/16, 1024 + 128]`: 16 rows of 4 dims x 16 keys (levels + 128), then the scales [2][16]."""
    kv, n, _ = keys.shape
    levels, scale = q8(keys)
    biased = (levels.view(torch.uint8) ^ 0x80).view(kv, n // 16, 16, 16, 4).permute(0, 1, 3, 2, 4)
    scales = scale.view(kv, n // 16, 16, 2).transpose(-1, -2).contiguous().view(torch.uint8)
    return torch.cat([biased.reshape(kv, n // 16, -1), scales.reshape(kv, n // 16, -1)], -1).contiguous()


def value_quads_8bit(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quads `[kv, n/4, 256]` (dim-major, 4 positions a lane) and the scales `[kv, 2, n]`."""
    kv, n, _ = values.shape
    levels, scale = q8(values)
    quads = levels.view(torch.uint8).view(kv, n // 4, 4, DIM).transpose(-1, -2).reshape(kv, n // 4, -1)
    return quads.contiguous(), scale.transpose(1, 2).contiguous()


def bf16_tiles(keys: torch.Tensor) -> torch.Tensor:
    """Keys `[kv, n, 64]` as `[kv, n/16, 32, 16, 2]` bfloat16 bits: a lane is one key's pair of dimensions."""
    kv, n, _ = keys.shape
    bits = keys.to(torch.bfloat16).view(torch.int16)
    return bits.reshape(kv, n // 16, 16, DIM // 2, 2).permute(0, 1, 3, 2, 4).contiguous()


def bf16_pairs(values: torch.Tensor) -> torch.Tensor:
    """Values `[kv, n, 64]` as `[kv, n/2, 64, 2]` bfloat16 bits: a lane is two positions' value of one dimension."""
    kv, n, _ = values.shape
    return values.to(torch.bfloat16).view(torch.int16).reshape(kv, n // 2, 2, DIM).transpose(-1, -2).contiguous()


def reference(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float) -> torch.Tensor:
    q = query.double().view(KV, GROUP, DIM)
    weights = (torch.einsum("kgd,knd->kgn", q, keys.double()) * scale).softmax(-1)
    return torch.einsum("kgn,knd->kgd", weights, values.double()).reshape(KV * GROUP, DIM)


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b).norm() / b.norm()).item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--context", type=int, default=4096, help="cache positions (a multiple of 256)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=41)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if args.context % BLOCK:
        raise SystemExit(f"--context must be a multiple of {BLOCK}")
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as folder:
        proto = cpp_extension.load(
            name="attention_prototypes",
            sources=[str(ROOT / "benchmarks/attention_prototypes.cpp"), str(CSRC / "parallel.cpp")],
            extra_cflags=["-O3", "-march=native", "-fopenmp", "-ffp-contract=off"],
            extra_include_paths=[str(CSRC)], build_directory=folder,
        )  # fmt: skip
    engine = kernels.load()
    dpbf16 = proto.dpbf16_mismatches(100_000)
    print(f"vdpbf16ps against 'acc + odd product, then + even product' in float32: {dpbf16} of 1,600,000 lanes differ")

    n, heads, scale = args.context, KV * GROUP, DIM**-0.5
    torch.manual_seed(0)
    keys16 = (torch.randn(LAYERS, KV, n, DIM) * 2).half()
    values16 = torch.randn(LAYERS, KV, n, DIM).half()
    query = torch.randn(1, heads, DIM) * 2
    tiles = [bf16_tiles(k) for k in keys16]
    pairs = [bf16_pairs(v) for v in values16]
    keys8 = [key_tiles_8bit(k) for k in keys16]
    values8 = [value_quads_8bit(v) for v in values16]
    layout = RowLayout.build(torch.tensor([n - 1]), n - 1, None)  # the new token is the last cache row

    def today(i: int) -> torch.Tensor:
        return engine.row_attention(
            query, query, keys16[i], values16[i], layout.lowest, layout.ancestors, 0, layout.stored,
            layout.offset, layout.committed, scale, layout.block,
        )[0]  # fmt: skip

    methods: dict[str, Callable[[int], object]] = {
        "float16 cache, float32 arithmetic (the engine)": today,
        "bfloat16 tiles, vdpbf16ps": lambda i: proto.bf16_attend(query[0], tiles[i], pairs[i], scale, BLOCK),
        "8-bit cache, vpdpbusd": lambda i: proto.i8_attend(query[0], keys8[i], *values8[i], scale, BLOCK),
        "read the float16 bytes only": lambda i: proto.touch(tiles[i], pairs[i], BLOCK),
    }  # fmt: skip
    errors: dict[str, float] = {}
    for name, fn in list(methods.items())[:3]:
        errors[name] = statistics.mean(
            relative(fn(i), reference(query[0], keys16[i], values16[i], scale))  # type: ignore[arg-type]
            for i in range(LAYERS)
        )

    def eight_bit(x: torch.Tensor) -> torch.Tensor:  # the 8-bit cache's rows, widened
        return kv_rows.unpack(kv_rows.pack(x))

    errors["8-bit cache alone (float64 arithmetic)"] = statistics.mean(
        relative(
            reference(query[0], eight_bit(keys16[i]), eight_bit(values16[i]), scale),
            reference(query[0], keys16[i], values16[i], scale),
        )
        for i in range(LAYERS)
    )
    for name, error in errors.items():
        print(f"relative error against float64 over the float16 cache: {name}: {error:.2e}")

    seconds: dict[str, list[float]] = {name: [] for name in methods}
    for _ in range(args.repeats):  # taking turns: a burst of load hits each alike
        for name, fn in methods.items():
            start = time.perf_counter()
            for i in range(LAYERS):
                fn(i)
            seconds[name].append(time.perf_counter() - start)
    base = seconds[next(iter(methods))]
    rows = []
    print(f"\n{n} positions x {LAYERS} layers, {args.threads} threads, {args.repeats} rounds")
    print(f"{'attention':48} {'ms':>6} {'/engine':>8} {'IQR':>12}")
    for name, times in seconds.items():
        ratios = sorted(t / b for t, b in zip(times, base, strict=True))
        quartiles = statistics.quantiles(ratios, n=4)
        row = {"attention": name, "ms": statistics.median(times) * 1e3, "ratio": statistics.median(ratios),
               "ratio_iqr": [quartiles[0], quartiles[2]], "relative_error": errors.get(name)}  # fmt: skip
        rows.append(row)
        print(f"{name:48} {row['ms']:6.2f} {row['ratio']:8.3f} {quartiles[0]:5.3f}-{quartiles[2]:5.3f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    command = (
        f"python benchmarks/attention_prototypes.py --context {n} --threads {args.threads} --repeats {args.repeats}"
    )
    args.out.write_text(json.dumps({
        "command": command, "dpbf16_mismatches_of_1600000": dpbf16, "errors": errors, "rows": rows,
    }, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
