"""What storing the KV cache in fewer bits would cost in quality, before any kernel reads such a cache
(issue 41): held-out NLL of the embedded model with its keys and values rounded as a cache would hold
them, through the stock attention (sdpa) on the rounded keys and values, window 2048, stride 1024.

Roundings: float32 (none), float16 (today's CPU cache), and 8 bits per value with a scale per group of
32 along the head dimension (round to nearest, clamped to +-127, as Q8_0), the scale stored in float16
or in float32. And "q8 arithmetic": that 8-bit cache read by integer dot products as a kernel would
(benchmarks/attention_prototypes.py): the query in 8 bits per 32 dimensions too, and each row's weights
per block of 256 positions, times the values' scales, in unsigned 8 bits (255 at the block's largest),
emulated in float64; "q8 dot products" the same with the weights kept in float; "16-bit query" with
the query in 16 bits per 32 dimensions (16-bit products, vpdpwssd); "two-part query" with the query as
8-bit levels plus 8-bit levels of what rounding left (in 1/254 of a level). Prints the NLL per text
and rounding, writes JSON.

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

ROUNDINGS = (
    "float32", "float16", "q8, float16 scale", "q8, float32 scale", "q8 dot products", "q8 arithmetic",
    "q8 arithmetic, 16-bit query", "q8 arithmetic, two-part query",
)  # fmt: skip
_EMULATED = {  # rounding: (weights in 8 bits, the query's largest level, its rest in 8 bits more)
    "q8 dot products": (False, 127, False),
    "q8 arithmetic": (True, 127, False),
    "q8 arithmetic, 16-bit query": (True, 32767, False),
    "q8 arithmetic, two-part query": (True, 127, True),
}
BLOCK = 256
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


def levels_and_scales(x: torch.Tensor, top: int = 127) -> tuple[torch.Tensor, torch.Tensor]:
    """Levels in +-`top` with float32 scales: `[..., d / 32, 32]` and `[..., d / 32, 1]`, float64 (Q8: 127)."""
    groups = x.double().unflatten(-1, (-1, 32))
    scale = (groups.abs().amax(-1, keepdim=True) / top).float().double()
    return torch.round(groups / torch.where(scale > 0, scale, 1)).clamp(-top, top), scale


def q8_arithmetic(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    scaling: float,
    *,
    weights_in_8_bits: bool = True,
    query_top: int = 127,
    query_rest: bool = False,
) -> torch.Tensor:
    """Causal attention `[b, q, heads, d]` as an 8-bit integer kernel computes it (module docstring)."""
    heads, q_len, k_len = query.shape[1], query.shape[2], key.shape[2]
    repeat = heads // key.shape[1]
    ql, qs = levels_and_scales(query, query_top)
    if query_rest:  # what rounding left, in 8 bits of 1/254 of a level: two vpdpbusd per key, exact sums
        remainder = query.double().unflatten(-1, (-1, 32)) / torch.where(qs > 0, qs, 1) - ql
        ql = ql + torch.round(remainder * 254).clamp(-127, 127) / 254
    kl, ks = levels_and_scales(key.repeat_interleave(repeat, dim=1))
    vl, vs = levels_and_scales(value.repeat_interleave(repeat, dim=1))
    # exact integer dot products per group of 32, times both scales: [b, h, q, k]
    scores = ((ql * qs).flatten(-2) @ (kl * ks).flatten(-2).transpose(-1, -2)) * scaling
    seen = torch.arange(k_len)[None, :] <= (k_len - q_len + torch.arange(q_len))[:, None]
    scores = scores.masked_fill(~seen, float("-inf"))
    blocks = -(-k_len // BLOCK)
    padded = torch.nn.functional.pad(scores, (0, blocks * BLOCK - k_len), value=float("-inf"))
    per_block = padded.unflatten(-1, (blocks, BLOCK))  # [b, h, q, blocks, 256]
    top = per_block.amax(-1, keepdim=True)
    weights = torch.exp(per_block - torch.where(top > float("-inf"), top, 0)).nan_to_num(0.0)
    out = torch.zeros(*query.shape[:3], query.shape[-1], dtype=torch.float64)
    total = torch.zeros(*query.shape[:3], 1, dtype=torch.float64)
    overall = top.amax(-2)  # [b, h, q, 1]
    pad = blocks * BLOCK - k_len
    vl_p = torch.nn.functional.pad(vl, (0, 0, 0, 0, 0, pad)).unflatten(2, (blocks, BLOCK))  # [b, h, blocks, 256, g, 32]
    vs_p = torch.nn.functional.pad(vs, (0, 0, 0, 0, 0, pad)).unflatten(2, (blocks, BLOCK))  # [b, h, blocks, 256, g, 1]
    for b in range(blocks):
        w = weights[..., b, :]  # [b, h, q, 256]
        factor = torch.exp(torch.where(top[..., b, :] > float("-inf"), top[..., b, :] - overall, float("-inf")))
        scaled = w[..., None] * vs_p[:, :, b, None, :, :, 0]  # [b, h, q, 256, g]: weight times value scale
        most = scaled.amax(-2, keepdim=True)
        step = torch.where(most > 0, most / 255, 1)
        quantised = torch.round(scaled / step) if weights_in_8_bits else scaled / step  # unsigned 8 bits
        block_out = torch.einsum("bhqkg,bhkgc->bhqgc", quantised, vl_p[:, :, b]) * step[..., 0, :, None]
        out += factor * block_out.flatten(-2)
        total += factor * w.sum(-1, keepdim=True)
    return (out / total).transpose(1, 2).to(query.dtype)


def attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: Any, **kw: Any) -> Any:
    if _chosen["rounding"] in _EMULATED:
        eight_bit_weights, query_top, query_rest = _EMULATED[_chosen["rounding"]]
        scaling = kw.get("scaling") or module.scaling
        out = q8_arithmetic(
            query, key, value, scaling, weights_in_8_bits=eight_bit_weights, query_top=query_top, query_rest=query_rest
        )
        return out, None
    return sdpa_attention_forward(module, query, rounded(key), rounded(value), mask, **kw)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("texts", nargs="+", type=Path)
    p.add_argument("--tokens", type=int, default=12288, help="the first N tokens of each text")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--roundings", default=";".join(ROUNDINGS), help="separated by ';', of: " + "; ".join(ROUNDINGS))
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    AttentionInterface.register("kv_bits", attention)
    loaded = load_model(ModelSpec(rope_scaling="none"))
    model, tokenizer = loaded.model, loaded.tokenizer
    model.set_attn_implementation("kv_bits")
    rows = []
    for text in a.texts:
        ids = tokenizer(text.read_text(), add_special_tokens=False)["input_ids"][: a.tokens]
        for rounding in a.roundings.split(";"):
            if rounding not in ROUNDINGS:
                raise SystemExit(f"unknown rounding {rounding!r}; known: {'; '.join(ROUNDINGS)}")
            _chosen["rounding"] = rounding
            start = time.perf_counter()
            nll = token_nll(model, ids, window=2048, stride=1024).mean().item()
            rows.append({"text": text.name, "tokens": len(ids), "rounding": rounding, "nll": nll})
            print(f"{text.name}: {rounding}: NLL {nll:.5f} ({time.perf_counter() - start:.0f} s)", flush=True)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps({"command": "python benchmarks/kv_bits_quality.py ...", "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
