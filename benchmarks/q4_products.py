"""The 4-bit products of one forward, before and after the change of 2026-11-27, taken in turns in one process.

Before: torch's weight-only int4 kernel (`_weight_int4pack_mm_for_cpu`: bfloat16 activations, bfloat16
scale and offset per group), as the engine called it until then. After: `q4_products` (csrc/quantised_products.cpp:
activations quantised to 8 bits per group of 32, integer dot products, the GGUF's float16 scales).
Both read the same 4-bit levels of the embedded model's decoder (q/k/v and gate/up fused, o, down, every
layer), for a plain step (1 row), a verified tree (16 and 64 rows) and a prefill (512 rows); each case is
timed both ways in turns, --repeats times. Prints a table and writes JSON.

    python benchmarks/q4_products.py --threads 1 --out benchmarks/results/q4-products/threads-1.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch

from tokenswift_cli.backends.cpu import kernels
from tokenswift_cli.backends.cpu.int4 import GROUP, Int4Linear, unpack
from tokenswift_cli.config import ModelSpec
from tokenswift_cli.model.loading import load_model


def products(model: torch.nn.Module) -> list[Int4Linear]:
    """The products a forward runs: the fused ones where the layer has them."""
    out = []
    for layer in model.get_decoder().layers:  # type: ignore[operator]
        attn, mlp = layer.self_attn, layer.mlp
        out += [getattr(attn, "qkv_int4", None) or attn.q_proj, attn.o_proj]
        out += [getattr(mlp, "gate_up_int4", None) or mlp.gate_proj, mlp.down_proj]
    return out


def torch_int4(layer: Int4Linear) -> tuple[torch.Tensor, torch.Tensor]:
    """The same levels, scales and offsets in torch's int4 layout (w = (q - 8) * scale + (m + 8 * scale))."""
    q = unpack(layer.packed, (layer.out_features, layer.in_features))
    groups = layer.in_features // GROUP
    scale, low = layer.scales[: layer.out_features, :groups].float(), layer.lows[: layer.out_features, :groups].float()
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
    return packed, torch.stack([scale.t(), (low + 8 * scale).t()], dim=-1).contiguous().bfloat16()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--rows", default="1,16,64,512")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    load = os.getloadavg()
    model = load_model(ModelSpec(weights="int4")).model
    layers = products(model)
    before = [torch_int4(layer) for layer in layers]
    module = kernels.load()

    def run_before(x: dict[int, torch.Tensor]) -> None:
        for layer, (packed, scales) in zip(layers, before, strict=True):
            torch.ops.aten._weight_int4pack_mm_for_cpu(x[layer.in_features].bfloat16(), packed, GROUP, scales)

    def run_after(x: dict[int, torch.Tensor]) -> None:
        for layer in layers:
            module.q4_products(x[layer.in_features], layer.packed, layer.scales, layer.lows, None, layer.out_features)

    stored = [t for layer in layers for t in (layer.packed, layer.scales, layer.lows)]
    weight_bytes = sum(t.numel() * t.element_size() for t in stored)
    results = []
    for rows in (int(r) for r in args.rows.split(",")):
        x = {size: torch.randn(rows, size) for size in {layer.in_features for layer in layers}}
        seconds: dict[str, list[float]] = {"before": [], "after": []}
        for _ in range(args.repeats):
            for name, fn in (("before", run_before), ("after", run_after)):
                start = time.perf_counter()
                fn(x)
                seconds[name].append(time.perf_counter() - start)
        ms = {name: statistics.median(values) * 1e3 for name, values in seconds.items()}
        results.append({"rows": rows, "before_ms": ms["before"], "after_ms": ms["after"]})
    print(f"{len(layers)} products, {weight_bytes / 1e6:.1f} MB of 4-bit weights, {torch.get_num_threads()} threads, "
          f"load average before {load[0]:.2f}")  # fmt: skip
    print(f"{'rows':>5} {'before ms':>10} {'after ms':>9} {'speed-up':>9} {'after GB/s':>11}")
    for row in results:
        speed = weight_bytes / row["after_ms"] / 1e6
        print(f"{row['rows']:5d} {row['before_ms']:10.2f} {row['after_ms']:9.2f} "
              f"{row['before_ms'] / row['after_ms']:8.2f}x {speed:11.1f}")  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result = {
        "command": " ".join(["python benchmarks/q4_products.py", *(f"--{k} {v}" for k, v in vars(args).items())]),
        "load_before": load, "load_after": os.getloadavg(), "threads": torch.get_num_threads(),
        "weight_mb": weight_bytes / 1e6, "cases": results,
    }  # fmt: skip
    args.out.write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
