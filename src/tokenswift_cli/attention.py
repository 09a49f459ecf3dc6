"""Attention of new tokens over a KV cache: the fast path that both plain decoding and verification take.

GQA without repeated key/value heads: the query heads of one KV group are packed as extra query
rows, so every key/value row is read once per group (not `heads / kv_heads` times).

Candidates (q > 1) use split attention (cascade): all of them attend to the committed cache
*without a mask* (every candidate sees all of it), and to the small block of new tokens with the
block mask; the two softmaxes are merged by their log-sum-exp. No `[q, L]` mask is built, and the
long part runs in the fused CPU flash kernel. One token (q = 1) is a single unmasked call.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# Returns the log-sum-exp of each row next to the output; not a public API, so it is optional.
_FLASH_CPU = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def pack_queries(query: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """`[1, heads, q, d]` -> `[1, kv_heads, group * q, d]`: the heads of KV group j become its rows."""
    batch, heads, q_len, dim = query.shape
    return query.reshape(batch, kv_heads, (heads // kv_heads) * q_len, dim)


def unpack_output(out: torch.Tensor, heads: int, q_len: int) -> torch.Tensor:
    """`[1, kv_heads, group * q, d]` -> `[1, q, heads * d]` (the layout `o_proj` expects)."""
    dim = out.shape[-1]
    return out.reshape(out.shape[0], heads, q_len, dim).transpose(1, 2).reshape(out.shape[0], q_len, heads * dim)


def _block(
    packed: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, scaling: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked attention to the new tokens' block, in float32: output and log-sum-exp per row."""
    group = packed.shape[2] // mask.shape[0]
    scores = (packed.float() @ keys.float().transpose(-1, -2)) * scaling  # [1, kv, g*q, q]
    rows = mask.to(scores.device).repeat(group, 1)  # [g*q, q]: row r of head h is mask row r
    scores = scores.masked_fill(~rows, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # [1, kv, g*q]
    return torch.exp(scores - lse[..., None]) @ values.float(), lse


def split_attention(
    packed: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    *,
    committed: int,
    block_mask: torch.Tensor,
    scaling: float,
) -> torch.Tensor:
    """Packed queries over `committed` cached keys (no mask) + the new block (with `block_mask` `[q, q]`)."""
    block_keys, block_values = keys[:, :, committed:], values[:, :, committed:]
    out_block, lse_block = _block(packed, block_keys, block_values, block_mask, scaling)
    if committed == 0:
        return out_block.to(packed.dtype)
    out_cache, lse_cache = _FLASH_CPU(packed, keys[:, :, :committed], values[:, :, :committed], scale=scaling)
    total = torch.logaddexp(lse_cache, lse_block)  # [1, kv, g*q]
    merged = out_cache.float() * torch.exp(lse_cache - total)[..., None]
    merged += out_block * torch.exp(lse_block - total)[..., None]
    return merged.to(packed.dtype)


def masked_attention(
    packed: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    *,
    committed: int,
    block_mask: torch.Tensor,
    scaling: float,
) -> torch.Tensor:
    """The same result with one public masked call (devices without the CPU flash kernel)."""
    group = packed.shape[2] // block_mask.shape[0]
    rows = block_mask.to(packed.device).repeat(group, 1)  # [g*q, q]
    visible = torch.ones(rows.shape[0], committed, dtype=torch.bool, device=packed.device)
    mask = torch.cat([visible, rows], dim=1)  # [g*q, L + q]
    return F.scaled_dot_product_attention(packed, keys, values, attn_mask=mask, scale=scaling)


def attend(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    *,
    committed: int,
    block_mask: torch.Tensor | None,
    scaling: float,
) -> torch.Tensor:
    """Attention output `[1, q, heads * d]` of rotated queries `[1, heads, q, d]`.

    `keys`/`values` `[1, kv_heads, committed + q, d]` hold the committed positions then the new ones;
    a new token sees every committed position and the new tokens `block_mask` `[q, q]` allows
    (default: causal). Exact up to float rounding; equal to masked sdpa over the whole row.
    """
    heads, q_len = query.shape[1], query.shape[2]
    packed = pack_queries(query, keys.shape[1])  # [1, kv, g*q, d]
    if q_len == 1:  # one token sees everything: no mask at all
        out = F.scaled_dot_product_attention(packed, keys, values, scale=scaling)
        return unpack_output(out, heads, 1)
    if block_mask is None:
        block_mask = torch.ones(q_len, q_len, dtype=torch.bool, device=query.device).tril()
    use_split = _FLASH_CPU is not None and query.device.type == "cpu"
    fn = split_attention if use_split else masked_attention
    out = fn(packed, keys, values, committed=committed, block_mask=block_mask, scaling=scaling)
    return unpack_output(out, heads, q_len)
