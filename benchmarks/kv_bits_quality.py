"""What storing the KV cache in fewer bits would cost in quality, before any kernel reads such a cache
(issue 41): held-out NLL of the embedded model with its keys and values rounded as a cache would hold
them, through the stock attention (sdpa) on the rounded keys and values, window 2048, stride 1024.

Roundings: float32 (none), float16 (today's CPU cache), and 8 bits per value with a scale per group of
32 along the head dimension (round to nearest, clamped to +-127, as Q8_0), the scale stored in float16
or in float32. Prints the NLL per text and rounding, writes JSON.

    python benchmarks/kv_bits_quality.py src/tokenswift_cli/data/texts/britannica-shakespeare-biography.txt \\
        --tokens 12288 --threads 1 --out benchmarks/results/kv-cache/kv-bits-quality.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from tokenswift_cli.config import ModelSpec
from tokenswift_cli.model.loading import load_model
from tokenswift_cli.quality.perplexity import token_nll

ROUNDINGS = ("float32", "float16", "q8, float16 scale", "q8, float32 scale")
_chosen = {"rounding": "float32"}


def q8(x: torch.Tensor, scale_dtype: torch.dtype) -> torch.Tensor:
    """`x` `[..., d]` rounded to 8-bit levels with one scale (max |x| / 127, in `scale_dtype`) per 32 values."""
    groups = x.float().unflatten(-1, (-1, 32))
    scale = (groups.abs().amax(-1, keepdim=True) / 127).to(scale_dtype).float()
    levels = torch.round(groups / torch.where(scale > 0, scale, 1)).clamp(-127, 127)
    return (levels * scale).flatten(-2).to(x.dtype)


def rounded(x: torch.Tensor) -> torch.Tensor:
    rounding = _chosen["rounding"]
    if rounding == "float16":
        return x.half().to(x.dtype)
    if rounding.startswith("q8"):
        return q8(x, torch.float16 if "float16" in rounding else torch.float32)
    return x


def attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: Any, **kw: Any) -> Any:
    return sdpa_attention_forward(module, query, rounded(key), rounded(value), mask, **kw)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("texts", nargs="+", type=Path)
    p.add_argument("--tokens", type=int, default=12288, help="the first N tokens of each text")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    AttentionInterface.register("kv_bits", attention)
    loaded = load_model(ModelSpec(rope_scaling="none"))
    model, tokenizer = loaded.model, loaded.tokenizer
    model.set_attn_implementation("kv_bits")
    rows = []
    for text in a.texts:
        ids = tokenizer(text.read_text(), add_special_tokens=False)["input_ids"][: a.tokens]
        for rounding in ROUNDINGS:
            _chosen["rounding"] = rounding
            start = time.perf_counter()
            nll = token_nll(model, ids, window=2048, stride=1024).mean().item()
            rows.append({"text": text.name, "tokens": len(ids), "rounding": rounding, "nll": nll})
            print(f"{text.name}: {rounding}: NLL {nll:.5f} ({time.perf_counter() - start:.0f} s)", flush=True)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps({"command": "python benchmarks/kv_bits_quality.py ...", "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
