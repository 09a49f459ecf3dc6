"""Real model shapes with random weights on a GPU: the padded backend's plain step against the memory floor,
a 64-node verification against a plain step, `generate()` eager at long context, and the host's share;
with CUDA graphs (the default on a GPU) and without (`*_eager_ms`).

    python benchmarks/gpu_shapes.py --device cuda --out $OUT/shapes.json         # on the GPU machine
    TOKENSWIFT_PADDED=1 python benchmarks/gpu_shapes.py --dry-run --out /tmp/s.json  # the logic, on a CPU

Speed does not depend on the weights, so Llama-3.1-8B, Qwen2.5-7B and Qwen2.5-1.5B shapes are built
on the device in bfloat16. The floor is the weight bytes over the copy bandwidth measured first
(bytes read + written). Times are medians of device-synchronised repeats; `host_share` is the part
of a plain-decoding iteration (the engine's loop) during which the step's device work was not running.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, DynamicCache, LlamaConfig, Qwen2Config

from tokenswift_cli.config import RunConfig
from tokenswift_cli.engine.decode import generate
from tokenswift_cli.engine.state import prefill
from tokenswift_cli.engine.tree import build_tree
from tokenswift_cli.model.target import Target

SHAPES: dict[str, Callable[[], Any]] = {
    "llama-3.1-8b": lambda: LlamaConfig(
        vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, rope_theta=500000.0, max_position_embeddings=131072, tie_word_embeddings=False,
    ),
    "qwen2.5-7b": lambda: Qwen2Config(
        vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
        num_key_value_heads=4, max_position_embeddings=32768, tie_word_embeddings=False, use_sliding_window=False,
    ),
    "qwen2.5-1.5b": lambda: Qwen2Config(
        vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
        num_key_value_heads=2, max_position_embeddings=32768, tie_word_embeddings=True, use_sliding_window=False,
    ),
    "smollm2-135m": lambda: LlamaConfig(  # the embedded model's shape
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
        num_key_value_heads=3, max_position_embeddings=8192, tie_word_embeddings=True,
    ),
}  # fmt: skip
TINY = {
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "intermediate_size": 128,
    "vocab_size": 512,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    """Median milliseconds of `fn`, synchronised (one warm-up call first)."""
    fn()
    times = []
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        fn()
        sync(device)
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def copy_bandwidth(device: torch.device, megabytes: int) -> float:
    """GB/s of a device-to-device copy, counting the bytes read and written."""
    source = torch.randn(megabytes * 2**18, device=device)  # float32: 4 bytes each
    target = torch.empty_like(source)
    ms = timed(lambda: target.copy_(source), device, 10)
    return 2 * source.numel() * 4 / (ms / 1000) / 1e9


def build(shape: str, device: torch.device, dry: bool) -> torch.nn.Module:
    config = SHAPES[shape]()
    if dry:
        for key, value in TINY.items():
            setattr(config, key, value)
        config.head_dim = config.hidden_size // config.num_attention_heads
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    return model.eval().requires_grad_(False)


def measure(shape: str, device: torch.device, contexts: list[int], *, dry: bool, bandwidth: float) -> dict[str, Any]:
    model = build(shape, device, dry)
    target = Target(model)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    row: dict[str, Any] = {"shape": shape, "backend": type(target.backend).__name__, "weight_gb": weight_bytes / 1e9,
                           "kernel_attention": target.backend.kernel_attention,
                           "fused_layers": target.backend.fused_layers}  # fmt: skip
    row["floor_ms"] = weight_bytes / (bandwidth * 1e9) * 1000
    for context in contexts:
        row[f"ctx{context}"] = at_context(target, context, device, dry=dry, floor_ms=row["floor_ms"])
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return row


def at_context(target: Target, context: int, device: torch.device, *, dry: bool, floor_ms: float) -> dict[str, Any]:
    """A plain step, a 64-node verification, the engine's plain iteration and generate() eager after `context`."""
    model = target.model
    prompt = torch.randint(0, model.config.vocab_size, (context,), generator=torch.Generator().manual_seed(context))
    cfg = RunConfig(max_new_tokens=64, prefill_chunk=1024, mode="plain")
    state = prefill(target, prompt.tolist(), cfg)
    root, nodes = torch.tensor([state.root]), 64  # a tree's first nodes are a tree (parents come first)
    tree = build_tree(7, [(1, 2, 3, 4), (5, 6, 7, 8), (9, 10, 11)])  # 1 + 4 + 16 + 48 nodes

    def step() -> None:
        target.logits(target.forward(root, state.full, exact=True).hidden)

    def verification() -> None:
        forward = target.forward(
            tree.tokens[:nodes], state.full, depths=tree.depths[:nodes], block_mask=tree.mask[:nodes, :nodes],
            exact=True,
        )  # fmt: skip
        target.logits(forward.hidden[:16])

    plain_ms = timed(step, device, 5 if dry else 20)
    verify_ms = timed(verification, device, 5 if dry else 10)
    graphs = getattr(target.backend, "graphs", None)
    eager: dict[str, float] = {}
    if graphs is not None:  # the same forwards launched op by op, for the graphs' gain
        target.backend.graphs = None
        eager = {"plain_step_eager_ms": timed(step, device, 5 if dry else 10),
                 "verify64_eager_ms": timed(verification, device, 5 if dry else 5)}  # fmt: skip
        target.backend.graphs = graphs
    sync(device)  # the engine's own loop, plain decoding: its iterations against the step's device time
    start = time.perf_counter()
    iterations = sum(1 for _ in generate(target, None, state, cfg.replace(max_new_tokens=32)))
    sync(device)
    iteration_ms = (time.perf_counter() - start) * 1000 / max(1, iterations)
    generate_ms = eager_ms(model, prompt.tolist(), device)
    return {
        "plain_step_ms": plain_ms, "verify64_ms": verify_ms, "verify64_over_step": verify_ms / plain_ms,
        "step_over_floor": plain_ms / floor_ms, "iteration_ms": iteration_ms,
        "host_share": max(0.0, 1 - plain_ms / iteration_ms), "generate_eager_ms": generate_ms,
        "plain_speedup_over_generate": generate_ms / iteration_ms, **eager,
    }  # fmt: skip


def eager_ms(model: torch.nn.Module, prompt: list[int], device: torch.device, steps: int = 16) -> float:
    """Milliseconds per token of `generate()` (eager, sdpa, greedy) after a prefilled DynamicCache."""
    from transformers import GenerationConfig

    cache = DynamicCache()
    model.set_attn_implementation("sdpa")
    with torch.no_grad():
        for start in range(0, len(prompt) - 1, 1024):
            chunk = torch.tensor([prompt[start : min(start + 1024, len(prompt) - 1)]], device=device)
            model(input_ids=chunk, past_key_values=cache, use_cache=True, logits_to_keep=1)
        ids = torch.tensor([prompt], device=device)
        config = GenerationConfig(max_new_tokens=steps, do_sample=False, pad_token_id=0)
        sync(device)
        start = time.perf_counter()
        model.generate(ids, generation_config=config, past_key_values=cache)
        sync(device)
    model.set_attn_implementation("tokenswift")
    return (time.perf_counter() - start) * 1000 / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--shapes", default="llama-3.1-8b,qwen2.5-7b,qwen2.5-1.5b")
    parser.add_argument("--contexts", default="2048,16384", help="the first shape's; the others take the first")
    parser.add_argument("--dry-run", action="store_true", help="tiny layers on any device: the script's logic only")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    device = torch.device(args.device if not args.dry_run else "cpu")
    contexts = [int(c) for c in args.contexts.split(",")]
    if args.dry_run:
        contexts = [64, 128]
    document: dict[str, Any] = {"device": str(device), "torch": torch.__version__, "shapes": []}
    if device.type == "cuda":
        document["gpu"] = torch.cuda.get_device_name(device)
    document["copy_gb_s"] = copy_bandwidth(device, 16 if args.dry_run else 2048)
    for index, shape in enumerate(args.shapes.split(",")):
        row = measure(shape, device, contexts if index == 0 else contexts[:1], dry=args.dry_run,
                      bandwidth=document["copy_gb_s"])  # fmt: skip
        document["shapes"].append(row)
        args.out.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")  # what was measured, kept
        print(json.dumps(row), flush=True)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
