"""Keys and values stored in 8 bits (`--kv-cache int8`): each row packed with its scales.

A row of `dim` values is cut into groups of 32 along the head dimension (as llama.cpp's Q8_0); each
group keeps `round(x / s)` in int8 with `s = max |x| / 127` in float32. A packed row is those `dim`
bytes, then the `dim / 32` scales' bytes: `dim * 9 / 8` bytes against `2 * dim` in float16, and a
row travels with its scales through every copy of the cache (commit, evict, the partial cache,
checkpoints), which see only rows of bytes. Widening is `level * s` in float32, the same on every
path (here, and `widen` in csrc/row_attention.cpp; `put` in csrc/decoder.cpp packs as `pack` does).

Measured before it was built (benchmarks/kv_bits_quality.py, results/kv-cache): held-out NLL of the
embedded model +0.0003% against float32 storage (float16: -0.009%), Britannica, 12K tokens.

The CPU kernel reads these rows by integer products (csrc/q8_attention.cpp: the query in 8 bits and 8
more for its rest, the weights in 8 bits per block), an arithmetic of its own: `ARITHMETIC` names it,
runs record it, and one written under another says so when resumed. It reads a full cache's rows laid
out again by tiles of 16 positions (keys transposed, values by 4 positions, scales apart), kept with the
cache (`PreallocatedLayer.tiles`): each tile laid out once, when its 16 positions are committed.
"""

from __future__ import annotations

import torch

GROUP = 32
PACKED = torch.uint8  # the buffers' dtype
STORAGE = torch.int8  # how a cache names this storage (`FullCache(dtype=STORAGE)`)
ARITHMETIC = "integer products, 8-bit weights per block"  # since 2026-11-28
EARLIER = "float32 products of the widened rows"  # until then, not recorded


TILE = 16  # positions a tile of the CPU kernel's layout holds


def tile_bytes(dim: int) -> int:
    """Bytes of one tile (keys and values of `TILE` positions of one kv head) laid out for the CPU kernel."""
    return 2 * TILE * packed_width(dim)


def packed_width(dim: int) -> int:
    """Bytes of one packed row of `dim` values."""
    if dim % GROUP:
        raise ValueError(f"8-bit keys and values need a head size that is a multiple of {GROUP}, not {dim}")
    return dim + 4 * (dim // GROUP)


def value_width(width: int) -> int:
    """The head size of packed rows `width` bytes wide."""
    return width * GROUP // (GROUP + 4)


def pack(x: torch.Tensor) -> torch.Tensor:
    """Rows `[..., dim]` (any float dtype, computed in float32) as packed rows `[..., packed_width(dim)]`."""
    groups = x.float().unflatten(-1, (-1, GROUP))
    scale = groups.abs().amax(-1, keepdim=True) / 127
    levels = torch.round(groups / torch.where(scale > 0, scale, 1)).clamp(-127, 127).to(torch.int8)
    return torch.cat([levels.flatten(-2).view(PACKED), scale.flatten(-2).contiguous().view(PACKED)], dim=-1)


def unpack(rows: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Packed rows `[..., width]` widened to `[..., dim]` in `dtype` (through float32)."""
    dim = value_width(rows.shape[-1])
    levels = rows[..., :dim].contiguous().view(torch.int8).float().unflatten(-1, (-1, GROUP))
    scale = rows[..., dim:].contiguous().view(torch.float32).unsqueeze(-1)
    return (levels * scale).flatten(-2).to(dtype)


def widened(stored: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Cache rows as stored (packed, or a float dtype) in `dtype`."""
    return unpack(stored, dtype) if stored.dtype == PACKED else stored.to(dtype)
