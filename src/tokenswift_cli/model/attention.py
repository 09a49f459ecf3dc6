"""Attention of new tokens over a KV cache: the fast path that both plain decoding and verification take.

GQA without repeated key/value heads: the query heads of one KV group are packed as extra query
rows, so every key/value row is read once per group (not `heads / kv_heads` times).

Candidates (q > 1) use split attention (cascade): all of them attend to the committed cache
*without a mask* (every candidate sees all of it), and to the small block of new tokens with the
block mask; the two softmaxes are merged by their log-sum-exp. No `[q, L]` mask is built, and the
long part runs in the fused CPU flash kernel. One token (q = 1) is a single unmasked call.

With several CPU threads, a long cache is cut into equal chunks passed as a batch (split-KV, as in
flash-decoding): the kernel parallelises over batch x KV heads, and 3 KV heads alone would leave
threads idle; the chunks' partial softmaxes are merged by log-sum-exp like the two parts above.
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


# Split the cache only past this many positions, into chunks of about this many: fixed sizes, not
# a number per thread, so that a prefill gives the same bits on any number of threads.
SPLIT_KV_MIN = 4096
SPLIT_KV_CHUNK = 2048


def _merge(outs: torch.Tensor, lses: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge partial attentions `[parts, ...rows, d]` with log-sum-exps `[parts, ...rows]` (float32)."""
    total = torch.logsumexp(lses, dim=0)
    weights = torch.exp(lses - total)[..., None]
    return (outs.float() * weights).sum(dim=0), total


def cache_attention(
    packed: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scaling: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Unmasked attention of packed queries `[1, kv, r, d]` over `keys`/`values` `[1, kv, L, d]`.

    Returns the output and the log-sum-exp per row; a long cache is split into chunks that the
    threads share (split-KV), the same chunks whatever the number of threads.
    """
    length = keys.shape[2]
    if length < SPLIT_KV_MIN:
        out, lse = _FLASH_CPU(packed, keys, values, scale=scaling)[:2]
        return out, lse
    parts = max(2, length // SPLIT_KV_CHUNK)
    chunk = length // parts
    even = parts * chunk  # positions in the equal chunks; the few left over go in one more call
    k_chunks = keys[0, :, :even].unflatten(1, (parts, chunk)).transpose(0, 1)  # [parts, kv, chunk, d]
    v_chunks = values[0, :, :even].unflatten(1, (parts, chunk)).transpose(0, 1)
    outs, lses = _FLASH_CPU(packed.expand(parts, -1, -1, -1), k_chunks, v_chunks, scale=scaling)[:2]
    if even < length:
        rest_out, rest_lse = _FLASH_CPU(packed, keys[:, :, even:], values[:, :, even:], scale=scaling)[:2]
        outs, lses = torch.cat([outs, rest_out]), torch.cat([lses, rest_lse])
    out, lse = _merge(outs, lses)
    return out[None], lse[None]


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
    out_cache, lse_cache = cache_attention(packed, keys[:, :, :committed], values[:, :, :committed], scaling)
    merged, _ = _merge(torch.stack([out_cache.float(), out_block]), torch.stack([lse_cache, lse_block]))
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
    use_split = _FLASH_CPU is not None and query.device.type == "cpu"
    if q_len == 1:  # one token sees everything: no mask at all
        if use_split:
            out = cache_attention(packed, keys, values, scaling)[0].to(packed.dtype)
        else:
            out = F.scaled_dot_product_attention(packed, keys, values, scale=scaling)
        return unpack_output(out, heads, 1)
    if block_mask is None:
        block_mask = torch.ones(q_len, q_len, dtype=torch.bool, device=query.device).tril()
    fn = split_attention if use_split else masked_attention
    out = fn(packed, keys, values, committed=committed, block_mask=block_mask, scaling=scaling)
    return unpack_output(out, heads, q_len)


def window_attention(
    query: torch.Tensor,
    sink_query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    *,
    positions: torch.Tensor,
    committed: int,
    first_recent: int,
    sinks: int,
    size: int,
    block_mask: torch.Tensor | None,
    scaling: float,
) -> torch.Tensor:
    """Attention `[1, q, heads * d]` under a context window (see `config.ContextWindow`).

    `keys`/`values` `[1, kv, stored + q, d]` hold the sinks, the recent positions
    `[first_recent, committed)`, then the q new tokens at `positions` `[q]`. Row i sees the sinks
    through `sink_query` (rotated as if the sinks sat just before its window), the recent positions
    after `positions[i] - size`, and the new tokens `block_mask` allows. The recent positions every
    row sees go through the unmasked fast path; the sinks, the few positions only some rows still
    see, and the new block make one small masked part in float32; the two merge by log-sum-exp.
    """
    heads, q_len = query.shape[1], query.shape[2]
    kv = keys.shape[1]
    assert committed >= sinks, "the sinks must be cached before a row can lose sight of anything"
    stored = sinks + committed - first_recent
    if block_mask is None:
        block_mask = torch.ones(q_len, q_len, dtype=torch.bool, device=query.device).tril()
    lowest = positions - size + 1  # [q]: the earliest recent position each row sees
    assert max(sinks, int(lowest.min())) >= first_recent, "a position the window still needs was dropped"
    shared_from = max(first_recent, int(lowest.max()))  # every row sees [shared_from, committed)
    edge_from = max(first_recent, int(lowest.min()))
    edge_positions = torch.arange(edge_from, shared_from, device=query.device)  # [e]
    edge = slice(sinks + edge_from - first_recent, sinks + shared_from - first_recent)
    visible = torch.cat(
        [
            (torch.arange(sinks, device=query.device)[None] <= positions[:, None]),  # sinks: all but the future
            edge_positions[None] >= lowest[:, None],
            block_mask.to(query.device),
        ],
        dim=1,
    )  # [q, sinks + e + q]
    group = heads // kv
    rows = visible.repeat(group, 1)  # [g*q, sinks + e + q]
    packed, packed_sinks = pack_queries(query, kv).float(), pack_queries(sink_query, kv).float()
    small_keys = torch.cat([keys[:, :, edge], keys[:, :, stored:]], dim=2).float()
    small_values = torch.cat([values[:, :, :sinks], values[:, :, edge], values[:, :, stored:]], dim=2).float()
    scores = (
        torch.cat(
            [packed_sinks @ keys[:, :, :sinks].float().transpose(-1, -2), packed @ small_keys.transpose(-1, -2)], dim=-1
        )
        * scaling
    )  # [1, kv, g*q, sinks + e + q]
    scores = scores.masked_fill(~rows, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.exp(scores - lse[..., None]) @ small_values  # [1, kv, g*q, d]
    shared = slice(sinks + shared_from - first_recent, stored)
    if shared.stop > shared.start:
        fast = _FLASH_CPU is not None and query.device.type == "cpu"
        with_lse = cache_attention if fast else _attention_with_lse
        out_shared, lse_shared = with_lse(pack_queries(query, kv), keys[:, :, shared], values[:, :, shared], scaling)
        out, _ = _merge(torch.stack([out_shared.float(), out]), torch.stack([lse_shared.float(), lse]))
    return unpack_output(out.to(query.dtype), heads, q_len)


def _attention_with_lse(
    packed: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scaling: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Unmasked attention and its log-sum-exp per row, with public ops (devices without the CPU kernel)."""
    scores = (packed.float() @ keys.float().transpose(-1, -2)) * scaling
    lse = torch.logsumexp(scores, dim=-1)
    return torch.exp(scores - lse[..., None]) @ values.float(), lse
