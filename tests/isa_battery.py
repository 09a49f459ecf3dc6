"""What the kernels compute, on fixed inputs: run under each instruction-set build (tests/test_isas.py).

`python tests/isa_battery.py OUT` writes the results (products of every dense type and of the 4-bit and
8-bit weights, and tokens written by tiny models through every kernel) to OUT with `torch.save`.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import torch
from conftest import tiny_model
from gguf import GGMLQuantizationType
from helpers import random_heads, random_prompt
from test_gguf_in_place import block_rows
from test_int4 import q4_linear
from test_row_attention import q8_weight
from tiny_gguf import BLOCK_TYPES, write_tiny_gguf

from tokenswift_cli.backends.cpu import dense, kernels
from tokenswift_cli.backends.cpu.int4 import Int4Linear, quantize_decoder
from tokenswift_cli.backends.cpu.q8_head import Q8Head
from tokenswift_cli.config import ContextWindow, DraftConfig, ModelSpec, RunConfig, SamplingConfig
from tokenswift_cli.engine.decode import generate_tokens
from tokenswift_cli.model.loading import load_model
from tokenswift_cli.model.target import Target

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def products() -> dict[str, torch.Tensor]:
    """Dense row and column products at real widths (and ragged ones), 1-9 rows; 4-bit and Q8_0 products."""
    out: dict[str, torch.Tensor] = {}
    generator = torch.Generator().manual_seed(0)
    for dtype in DTYPES:
        for inputs, outputs in ((1536, 576), (4096, 40), (37, 23)):
            w = torch.randn(outputs, inputs, generator=generator).to(dtype)
            x = torch.randn(9, inputs, generator=generator)
            out[f"linear-{dtype}-{inputs}"] = dense.linear(x.to(dtype), w)
            out[f"linear-float32-in-{dtype}-{inputs}"] = dense.linear(x, w)
        x, v = torch.randn(3, 9, 256, generator=generator), torch.randn(3, 256, 70, generator=generator)
        out[f"columns-{dtype}"] = dense.column_products(x.to(dtype), v.to(dtype))
    x = torch.randn(9, 1536, generator=generator) * 3
    q4, _ = Int4Linear.from_linear(q4_linear(64, 1536, seed=3))
    out["q4"] = q4(x)
    head = Q8Head.from_weight(q8_weight(67, 1536, seed=4))
    assert head is not None
    out["q8"] = head.logits(x)
    for kind in BLOCK_TYPES:  # a GGUF file's blocks, 1-9 rows
        rows = block_rows(kind, 45, 768, seed=5)
        out[f"gguf-{kind}"] = kernels.load().block_products(x[:, :768], rows, int(GGMLQuantizationType[kind]), None)
    return out


def texts() -> dict[str, torch.Tensor]:
    """Plain and TokenSwift tokens of tiny models: bfloat16 (dense products, exact attention), 4-bit (the
    native decoder, row attention), greedy and seeded sampling, under a window."""
    out: dict[str, torch.Tensor] = {}
    window = ContextWindow(size=64, sinks=4)
    for name in ("bfloat16", "int4"):
        model = tiny_model("qwen2")
        if name == "int4":
            quantize_decoder(model)
        else:
            model = model.to(torch.bfloat16)
        target = Target(model)
        heads, prompt = random_heads(target), random_prompt(60)
        if name == "bfloat16":
            heads = heads.to(torch.bfloat16)
        for sampling in (SamplingConfig(), SamplingConfig(temperature=1.0, min_p=0.05, seed=3)):
            cfg = RunConfig(max_new_tokens=120, sampling=sampling, window=window, prefill_chunk=32)
            plain, _ = generate_tokens(target, None, prompt, cfg.replace(mode="plain"))
            fast, _ = generate_tokens(target, heads, prompt, cfg.replace(draft=DraftConfig(tree=(1, 3, 3))))
            key = f"{name}-{'greedy' if sampling.temperature == 0 else 'sampled'}"
            out[f"{key}-plain"], out[f"{key}-tokenswift"] = torch.tensor(plain), torch.tensor(fast)
    kept = os.environ.get("TOKENSWIFT_CACHE")
    with tempfile.TemporaryDirectory() as folder:  # tiny GGUF files on their blocks (the native decoder)
        os.environ["TOKENSWIFT_CACHE"] = str(Path(folder) / "cache")  # their headers: not in the user's cache
        for kind in ("Q4_K", "Q6_K", "Q5_0"):
            path = write_tiny_gguf(Path(folder) / f"{kind}.gguf", kind)
            target = Target(load_model(ModelSpec(name=str(path), weights="gguf")).model)
            heads, prompt = random_heads(target), random_prompt(60)
            cfg = RunConfig(max_new_tokens=60, sampling=SamplingConfig(temperature=1.0, min_p=0.05, seed=3))
            plain, _ = generate_tokens(target, None, prompt, cfg.replace(mode="plain"))
            fast, _ = generate_tokens(target, heads, prompt, cfg.replace(draft=DraftConfig(tree=(1, 3, 3))))
            out[f"gguf-{kind}-plain"], out[f"gguf-{kind}-tokenswift"] = torch.tensor(plain), torch.tensor(fast)
    if kept is None:
        os.environ.pop("TOKENSWIFT_CACHE")
    else:
        os.environ["TOKENSWIFT_CACHE"] = kept
    return out


def battery() -> dict[str, torch.Tensor]:
    torch.set_num_threads(1)
    assert kernels.available(), "the kernels did not build"
    return {**products(), **texts()}


if __name__ == "__main__":
    torch.save(battery(), sys.argv[1])
