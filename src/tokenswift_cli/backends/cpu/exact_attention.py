"""Batch-invariant attention: a token gets bitwise the same output verified in a tree or decoded alone.

In bfloat16 the fast kernels round differently for one query row and for several (the CPU flash
kernel rescales and rounds per tile of rows and keys), so a tree's logits drift from plain
decoding's by up to ~0.5 and the texts part. Here every reduction that rounds is laid out by
*absolute position*, so it is the same for a row whatever else is in the batch:

* scores `q @ K^T` and each block's `P @ V` are the row-exact dense products (`dense.py`: one
  float32 order per output, whatever the rows or the CPU; a BLAS switches kernels by shape and CPU);
* `P @ V` runs per block of `BLOCK` absolute positions, zero-padded where a row sees nothing, so
  plain decoding and a tree feed every block product the very same vectors;
* the max is exact, and the sums over blocks and keys are taken in float64, where the order of
  a few hundred terms no longer shows after rounding back.

The linear layers need the same care, so in exact mode they too run through `dense.apply`.

float32 has a cheaper layout of the same idea (`exact_float32.py`), which `exact_attention` takes
for float32 inputs.

Only verification uses it (plain decoding is verification of the root alone); prefill and drafts
keep the fast path, whose keys/values both modes share or drop.
"""

from __future__ import annotations

import torch

from tokenswift_cli.backends.cpu.dense import column_products, row_products
from tokenswift_cli.backends.cpu.exact_float32 import Float32Layout, exact_attention_float32
from tokenswift_cli.model.attention import pack_queries, unpack_output

BLOCK = 256


def _per_row(tail: torch.Tensor, new: torch.Tensor, own: torch.Tensor) -> torch.Tensor:
    """Per packed row `[1, kv, rows, t + e, d]`: the shared `tail` `[1, kv, t, d]`, then `new[own[row]]`."""
    mine = new[:, :, own]  # [1, kv, rows, e, d]
    return torch.cat([tail[:, :, None].expand(-1, -1, own.shape[0], -1, -1), mine], dim=3)


def _block_values(probs: torch.Tensor, values: torch.Tensor, blocks: int, block: int) -> torch.Tensor:
    """Per block of `block` positions, `probs` `[1, kv, rows, nb * B]` times `values` `[1, kv, nb * B, d]`
    -> `[nb, 1, kv, rows, d]` float32."""
    parts = []
    for head in range(values.shape[1]):  # one head's cache rows are one contiguous stretch: no copy
        p = probs[0, head].unflatten(-1, (blocks, block)).transpose(0, 1)  # [nb, rows, B]
        parts.append(column_products(p, values[0, head].unflatten(0, (blocks, block))))  # [nb, rows, d]
    return torch.stack(parts, dim=1)[:, None]


def exact_attention(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    *,
    positions: torch.Tensor,
    committed: int,
    block_mask: torch.Tensor | None,
    scaling: float,
    first_recent: int = 0,
    sinks: int = 0,
    sink_query: torch.Tensor | None = None,
    window: int | None = None,
    block: int = BLOCK,
) -> torch.Tensor:
    """Attention `[1, q, heads * d]` of rotated queries `[1, heads, q, d]` at `positions` `[q]`.

    `keys`/`values` `[1, kv, stored + q, d]`: `sinks` positions, the recent ones `[first_recent,
    committed)`, then the q new tokens, which see each other as `block_mask` `[q, q]` says (a trie:
    ancestors at consecutive positions; default causal). With `window`, row i sees the sinks (through `sink_query`)
    and the positions after `positions[i] - window`; without, everything before it.
    """
    if query.dtype == torch.float32:
        layout = Float32Layout.build(
            positions, committed, block_mask, group=query.shape[1] // keys.shape[1], window=window, sinks=sinks,
            first_recent=first_recent, block=block,
        )  # fmt: skip
        return exact_attention_float32(query, keys, values, layout, scaling=scaling, sink_query=sink_query)
    heads, q_len = query.shape[1], query.shape[2]
    kv, group = keys.shape[1], heads // keys.shape[1]
    device = query.device
    if block_mask is None:
        block_mask = torch.ones(q_len, q_len, dtype=torch.bool, device=device).tril()
    stored = sinks + committed - first_recent
    lowest = positions - window + 1 if window is not None else torch.zeros_like(positions)
    lowest = lowest.clamp(min=sinks)  # [q]: the first recent position each row sees
    assert int(lowest.min()) >= first_recent or int(lowest.min()) >= committed, "a needed position was dropped"
    first_block = int(lowest.min()) // block
    cache_blocks = committed // block - first_block  # blocks of cached positions only, shared by all rows
    start = first_block * block
    end = (int(positions.max()) // block + 1) * block  # slots [start, end): positions of the blocks used
    # Each row's slots: cached positions [start, committed) and its ancestors at [committed, end).
    depth = positions - committed  # [q]
    ancestor = torch.zeros(q_len, end - committed, dtype=torch.long, device=device)
    rows, cols = block_mask.to(device).nonzero(as_tuple=True)
    ancestor[rows, depth[cols]] = cols  # node at each depth of each row's path
    slots = torch.arange(start, end, device=device)
    visible = (slots[None] >= lowest[:, None]) & (slots[None] <= positions[:, None])  # [q, slots]
    cached = slice(sinks + max(start, first_recent) - first_recent, stored)
    pad = max(0, first_recent - start) if start < committed else 0  # dropped slots before the held ones

    packed = pack_queries(query, kv)  # [1, kv, g*q, d]
    cache_keys, cache_values = keys[:, :, cached], values[:, :, cached]  # [1, kv, committed - start, d]
    if pad:  # slots before the first held position: zeros, which no row sees
        zeros = keys.new_zeros(1, kv, pad, keys.shape[-1])
        cache_keys, cache_values = torch.cat([zeros, cache_keys], dim=2), torch.cat([zeros, cache_values], dim=2)
    shared = cache_blocks * block  # slots in blocks of cached positions only: the same keys for every row
    # Blocks holding new positions, per tree row: the cached tail, then the row's own ancestors.
    mixed = (end - start) // block - cache_blocks
    own = ancestor.repeat(group, 1)  # [g*q, e]: packed row j is tree row j % q
    row_keys = _per_row(cache_keys[:, :, shared:], keys[:, :, stored:], own).unflatten(3, (mixed, block))
    row_values = _per_row(cache_values[:, :, shared:], values[:, :, stored:], own).unflatten(3, (mixed, block))
    n_rows = packed.shape[2]  # g*q
    own_scores = row_products(  # each row against its own blocks' keys: [kv * g*q, 1, m*B]
        packed[0].reshape(kv * n_rows, 1, -1), row_keys[0].reshape(kv * n_rows, mixed * block, -1)
    )
    scores = torch.cat(
        [row_products(packed[0], cache_keys[0, :, :shared])[None], own_scores.reshape(1, kv, n_rows, -1)], dim=-1
    )  # [1, kv, g*q, slots] float32
    scores = scores.masked_fill(~visible.repeat(group, 1), float("-inf")) * scaling
    top = scores.amax(-1, keepdim=True)
    sink_scores = None
    if sinks:
        assert sink_query is not None
        # A few keys: float32 products summed over one axis, the same for any number of rows.
        sink_keys = keys[:, :, None, :sinks].float()  # [1, kv, 1, s, d]
        sink_scores = (pack_queries(sink_query, kv).float()[:, :, :, None] * sink_keys).sum(-1) * scaling
        top = torch.maximum(top, sink_scores.amax(-1, keepdim=True))
    weights = torch.exp(scores - top)  # [1, kv, g*q, slots]
    total = weights.double().sum(-1)
    probs = weights.to(values.dtype)
    parts = []  # [blocks, 1, kv, g*q, d]: partial numerators, one per block
    if cache_blocks > 0:
        parts.append(_block_values(probs[..., :shared], cache_values[:, :, :shared], cache_blocks, block))
    p = probs[0, :, :, shared:].reshape(kv * n_rows * mixed, 1, block)  # each row's own blocks
    own_values = column_products(p, row_values[0].reshape(kv * n_rows * mixed, block, -1))  # [kv*g*q*m, 1, d]
    parts.append(own_values.reshape(1, kv, n_rows, mixed, -1).permute(3, 0, 1, 2, 4))
    if sink_scores is not None:
        sink_weights = torch.exp(sink_scores - top)
        total = total + sink_weights.double().sum(-1)
        sink_values = values[:, :, None, :sinks].float()  # [1, kv, 1, s, d]
        parts.append((sink_weights[..., None] * sink_values).sum(-2)[None])
    numerator = torch.cat(parts).double().sum(0)  # [1, kv, g*q, d]
    out = (numerator / total[..., None]).to(query.dtype)
    return unpack_output(out, heads, q_len)
