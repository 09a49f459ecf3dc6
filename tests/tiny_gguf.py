"""Tiny GGUF files written in the tests with `gguf`'s writer: a qwen2 or llama model in one block type.

Widths are multiples of 256 so that every format fits (K-quants pack 256 weights a block). Formats
`gguf` can quantise (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) are quantised from a tiny model's weights; K-quant
blocks are random bytes with scales chosen so the weights stay small (a K-quant block is bytes). The
file has no tokenizer: the engine runs it on token ids.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter
from gguf.quants import quantize

HIDDEN, INTERMEDIATE, LAYERS, HEADS, KV_HEADS, VOCAB = 256, 512, 2, 4, 2, 96
BLOCK_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K")
_HALF_FACTORS = {"Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0], "Q4_K": [0, 2],
                 "Q5_K": [0, 2], "Q6_K": [208]}  # fmt: skip
# Each factor's range: the weights come out at ~0.02-0.2
_FACTOR_RANGE = {"Q4_K": 2e-4, "Q5_K": 1e-4, "Q6_K": 2e-5}


def random_blocks(kind: str, rows: int, width: int, rng: np.random.Generator) -> np.ndarray:
    """Random blocks `[rows, bytes per row]` of a K-quant type, their float16 factors small and finite."""
    qtype = GGMLQuantizationType[kind]
    elements, size = GGML_QUANT_SIZES[qtype]
    data = rng.integers(0, 256, size=(rows, width // elements, size), dtype=np.uint8)
    scale = _FACTOR_RANGE.get(kind, 0.01)
    for offset in _HALF_FACTORS.get(kind, []):
        factor = rng.uniform(0.2 * scale, scale, size=(rows, width // elements)).astype(np.float16)
        data[..., offset : offset + 2] = factor[..., None].view(np.uint8)
    return data.reshape(rows, -1)


def _permute(rows: np.ndarray, heads: int) -> np.ndarray:
    """convert_hf_to_gguf's q/k row order for llama files (ggml's rotary embedding)."""
    return rows.reshape(heads, 2, rows.shape[0] // heads // 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)


def write_tiny_gguf(path: Path, kind: str, arch: str = "qwen2", seed: int = 0, tied: bool = False) -> Path:
    """A tiny `arch` model with every linear weight (and the embedding and head) in block type `kind`."""
    rng = np.random.default_rng(seed)
    qtype = GGMLQuantizationType[kind]
    writer = GGUFWriter(str(path), arch)
    writer.add_block_count(LAYERS)
    writer.add_context_length(4096)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(INTERMEDIATE)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_vocab_size(VOCAB)
    writer.add_bos_token_id(0)

    def weight(name: str, rows: int, width: int, std: float = 0.05, heads: int | None = None) -> None:
        if kind.endswith("_K"):
            data = random_blocks(kind, rows, width, rng)
        else:
            data = quantize(rng.normal(0.0, std, size=(rows, width)).astype(np.float32), qtype)
        if heads is not None and arch == "llama":
            data = _permute(data, heads)
        writer.add_tensor(name, data, raw_dtype=qtype)

    def values(name: str, shape: tuple[int, ...], mean: float = 0.0, std: float = 0.02) -> None:
        writer.add_tensor(name, rng.normal(mean, std, size=shape).astype(np.float32))

    weight("token_embd.weight", VOCAB, HIDDEN, std=1.0)
    head_dim = HIDDEN // HEADS
    for i in range(LAYERS):
        values(f"blk.{i}.attn_norm.weight", (HIDDEN,), mean=1.0, std=0.05)
        weight(f"blk.{i}.attn_q.weight", HIDDEN, HIDDEN, heads=HEADS)
        weight(f"blk.{i}.attn_k.weight", KV_HEADS * head_dim, HIDDEN, heads=KV_HEADS)
        weight(f"blk.{i}.attn_v.weight", KV_HEADS * head_dim, HIDDEN)
        if arch == "qwen2":
            values(f"blk.{i}.attn_q.bias", (HIDDEN,))
            values(f"blk.{i}.attn_k.bias", (KV_HEADS * head_dim,))
            values(f"blk.{i}.attn_v.bias", (KV_HEADS * head_dim,))
        weight(f"blk.{i}.attn_output.weight", HIDDEN, HIDDEN)
        values(f"blk.{i}.ffn_norm.weight", (HIDDEN,), mean=1.0, std=0.05)
        weight(f"blk.{i}.ffn_gate.weight", INTERMEDIATE, HIDDEN)
        weight(f"blk.{i}.ffn_up.weight", INTERMEDIATE, HIDDEN)
        weight(f"blk.{i}.ffn_down.weight", HIDDEN, INTERMEDIATE)
    values("output_norm.weight", (HIDDEN,), mean=1.0, std=0.05)
    if not tied:
        weight("output.weight", VOCAB, HIDDEN, std=0.3)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
