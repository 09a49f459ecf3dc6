"""What bounds each part of a plain step at the 4K window (issue 41, item 2): bytes read against time,
arithmetic against what the cores can do.

Loads the embedded model as `tokenswift write` does (4-bit layers, Q8_0 head, float16 KV cache),
prefills --context tokens of the held-out prefix, then times, taking turns in one process:

* the whole plain step: one token's forward over the cache (the native decoder) and its head row;
* each 4-bit product of every layer on one row (q/k/v fused, o, gate/up fused, down), as the decoder
  calls them (`q4_products`: float32 in, quantised to 8 bits, float32 out);
* the Q8_0 head on one row;
* the row attention of one token over --context float16 cache rows, per layer;
* the same products and attention with one layer's weights or cache read 30 times (in cache): as fast
  as from memory means bound by arithmetic, not by the bytes;
* the machine: a read-only pass over 512 MiB (the memory's speed), a float32 matrix product that stays
  in cache (the cores' arithmetic), timed in the same turns as the parts.

Prints a table (ms, MB read, GB/s, GFLOP/s and the share of the machine's measured speeds) and writes JSON.

    python benchmarks/step_bounds.py --context 4096 --repeats 15 --out benchmarks/results/sampler/step-bounds.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from tokenswift_cli.backends.cpu import kernels
from tokenswift_cli.backends.cpu.row_attention import RowLayout
from tokenswift_cli.bench.harness import Bench
from tokenswift_cli.bench.models import BenchRequest, open_model
from tokenswift_cli.engine.state import prefill
from tokenswift_cli.model.target import Target


def median_seconds(fn: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def nbytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def machine_parts() -> dict[str, tuple[Callable[[], Any], int, float]]:
    """The machine's own speeds, timed beside the parts: a read-only pass over 512 MiB (bytes), a float32
    matrix product in cache (arithmetic)."""
    big = torch.ones(128 * 2**20)
    a, b = torch.randn(384, 384), torch.randn(384, 384)
    return {
        "machine: read 512 MiB": (lambda: big.sum(), nbytes(big), 0.0),
        "machine: fp32 product in cache": (lambda: a @ b, 0, 2.0 * 384**3),
    }


def prefilled_plain_step(context: int) -> tuple[Target, Callable[[], None]]:
    """The embedded model loaded as `tokenswift write` loads it (4-bit layers, Q8_0 head, float16 cache), `context`
    tokens of the held-out prefix prefilled, and a plain step: one token's forward over the cache (the native
    decoder) and its head row, after which the cache rolls back (every call scores the same position)."""
    request = BenchRequest(
        lengths=(64,), length_context=context, contexts=(), methods=("plain",), sampling="default",
        context_window="4k",
    )  # fmt: skip
    model = open_model(request)
    target = model.target
    cfg = Bench(target, None, request.settings(model.run)).config("plain", request.cases()[0])
    state = prefill(target, model.prefix[:context], cfg)
    root = torch.tensor([state.root])

    def step() -> None:
        length = state.full.length
        forward = target.forward(root, state.full, exact=True)
        target.logits(forward.hidden[-1:])
        state.full.commit([])  # keep no new row
        assert state.full.length == length

    return target, step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    load = os.getloadavg()
    target, step = prefilled_plain_step(args.context)
    config = target.model.config
    layers = target.model.get_decoder().layers
    hidden = torch.randn(1, config.hidden_size)
    products: dict[str, list[Any]] = {"q/k/v": [], "o": [], "gate/up": [], "down": []}
    for layer in layers:
        products["q/k/v"].append(layer.self_attn.qkv_int4)
        products["o"].append(layer.self_attn.o_proj)
        products["gate/up"].append(layer.mlp.gate_up_int4)
        products["down"].append(layer.mlp.down_proj)
    inputs = {name: torch.randn(1, parts[0].in_features) for name, parts in products.items()}
    module = kernels.load()

    def apply(name: str, part: Any) -> None:
        module.q4_products(inputs[name], part.packed, part.scales, part.lows, None, part.out_features)

    def product(name: str) -> Callable[[], Any]:
        def run() -> None:
            for part in products[name]:
                apply(name, part)

        return run

    heads, kv = config.num_attention_heads, config.num_key_value_heads
    dim = config.hidden_size // heads
    cache_k = torch.randn(len(layers), kv, args.context + 1, dim).half()
    cache_v = torch.randn(len(layers), kv, args.context + 1, dim).half()
    layout = RowLayout.build(torch.tensor([args.context]), args.context, None)
    query = torch.randn(1, heads, dim)

    def attend(index: int) -> None:
        module.row_attention(
            query, query, cache_k[index], cache_v[index], layout.lowest, layout.ancestors, 0, layout.stored,
            layout.offset, layout.committed, dim**-0.5, layout.block,
        )  # fmt: skip

    def attention() -> None:
        for index in range(len(layers)):
            attend(index)

    head = target.q8_head
    parts: dict[str, tuple[Callable[[], Any], int, float]] = {
        "plain step (forward + head)": (step, 0, 0.0),
        "4-bit products, all layers": (lambda: [product(n)() for n in products], 0, 0.0),
        **{
            f"  {name} x {len(layers)}": (
                product(name),
                sum(nbytes(p.packed, p.scales, p.lows) for p in products[name]),
                2.0 * sum(p.in_features * p.out_features for p in products[name]),
            )
            for name in products
        },
        f"  gate/up of one layer x {len(layers)} (in cache)": (
            lambda: [apply("gate/up", products["gate/up"][0]) for _ in layers],
            0, 2.0 * len(layers) * products["gate/up"][0].in_features * products["gate/up"][0].out_features,
        ),
        "Q8_0 head, one row": (
            lambda: head.logits(hidden), nbytes(head.packed, head.scales), 2.0 * head.vocab * head.hidden,
        ),
        f"attention over {args.context} f16 rows x {len(layers)}": (
            attention, nbytes(cache_k, cache_v), 4.0 * heads * dim * args.context * len(layers),
        ),
        f"  one layer's attention x {len(layers)} (in cache)": (
            lambda: [attend(0) for _ in layers], 0, 4.0 * heads * dim * args.context * len(layers),
        ),
        **machine_parts(),
    }  # fmt: skip
    weight_bytes = sum(parts[f"  {n} x {len(layers)}"][1] for n in products)
    weight_flops = sum(parts[f"  {n} x {len(layers)}"][2] for n in products)
    parts["4-bit products, all layers"] = (parts["4-bit products, all layers"][0], weight_bytes, weight_flops)
    seconds: dict[str, list[float]] = {name: [] for name in parts}
    for _ in range(args.repeats):  # taking turns: a burst of load hits every part alike
        for name, (fn, _, _) in parts.items():
            seconds[name].append(median_seconds(fn, 1))

    def speed(name: str, index: int) -> float:
        return parts[name][1 + index] / statistics.median(seconds[name]) / 1e9

    speeds = {
        "read_gbs": speed("machine: read 512 MiB", 0), "fp32_gflops": speed("machine: fp32 product in cache", 1),
    }  # fmt: skip
    rows = []
    for name, (_, read, flops) in parts.items():
        ms = statistics.median(seconds[name]) * 1e3
        gbs = read / ms / 1e6 if read else 0.0
        gflops = flops / ms / 1e6 if flops else 0.0
        rows.append({
            "part": name.strip(), "ms": ms, "mb_read": read / 1e6, "gb_per_s": gbs, "gflop_per_s": gflops,
            "share_of_read_speed": gbs / speeds["read_gbs"], "share_of_fp32_peak": gflops / speeds["fp32_gflops"],
        })  # fmt: skip
    print(f"context {args.context}, {torch.get_num_threads()} threads, load average before {load[0]:.2f}")
    print(f"machine: read {speeds['read_gbs']:.1f} GB/s, fp32 product {speeds['fp32_gflops']:.0f} GFLOP/s")
    print(f"{'part':42} {'ms':>7} {'MB read':>8} {'GB/s':>6} {'GFLOP/s':>8} {'of read':>8} {'of fp32':>8}")
    for name, row in zip(parts, rows, strict=True):
        print(
            f"{name:42} {row['ms']:7.2f} {row['mb_read']:8.1f} {row['gb_per_s']:6.1f} {row['gflop_per_s']:8.1f} "
            f"{row['share_of_read_speed']:8.0%} {row['share_of_fp32_peak']:8.0%}"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result = {
        "command": " ".join(["python benchmarks/step_bounds.py", *(f"--{k} {v}" for k, v in vars(args).items())]),
        "load_before": load, "load_after": os.getloadavg(), "threads": torch.get_num_threads(),
        "machine": speeds, "parts": rows,
    }  # fmt: skip
    args.out.write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
