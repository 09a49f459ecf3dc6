"""Attention whose result for a row does not depend on the kernels that computed it (any device).

A token verified in a tree and the same token decoded alone reach the same keys by other routes
(the tree block or the cache, products of other shapes), so a GPU kernel may sum their terms in
another order. Here every sum that could round is taken where its order no longer shows:

* a score is a dot product of bfloat16 (or float32) vectors summed in float64: each product is
  exact there, and so is their sum while the terms span under ~37 bits (so: any order, any kernel),
  then rounded once to float32;
* the softmax's weights are float64 exponentials of the float32 scores less their max, so a kernel
  that takes the max by parts and rescales (`attention_kernel.py`) moves a weight by ~1e-16 relative;
* the sums of weights and of weights x values run in float64, where another order moves the result
  by ~1e-16 relative too: under the rounding back to the model's dtype (a flip needs the value within
  that distance of a rounding edge: ~1e-13 a bfloat16 element, ~1e-8 a float32 one).

So no row count, split size or key order is fixed here: the linear layers need that
(`padded.py`), attention does not. The price is the float64 products and the widened cache.
"""

from __future__ import annotations

import torch

from tokenswift_cli.model.attention import pack_queries, unpack_output


def _scores(packed: torch.Tensor, keys: torch.Tensor, scaling: float) -> torch.Tensor:
    """Float32 scores `[1, kv, rows, n]` of float64 packed queries over `keys` `[1, kv, n, d]`."""
    return (packed @ keys.double().transpose(-1, -2)).float() * scaling


def float64_attention(
    query: torch.Tensor,
    cache_keys: torch.Tensor,
    cache_values: torch.Tensor,
    tree_keys: torch.Tensor,
    tree_values: torch.Tensor,
    *,
    tree_visible: torch.Tensor,
    scaling: float,
    cache_visible: torch.Tensor | None = None,
    sink_query: torch.Tensor | None = None,
    cache_sinks: int = 0,
    tree_sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention `[1, q, heads * d]` of rotated queries `[1, heads, q, d]`.

    Keys/values `[1, kv, n, d]`: the held cache, then the new tokens' block. `tree_visible`
    `[q, t]` / `cache_visible` `[q, n]` (None: all) say which a row sees. Under a context window
    the keys of the sinks (the first `cache_sinks` cache slots, the tree columns `tree_sinks` `[t]`)
    are scored by `sink_query` instead.
    """
    heads, q_len = query.shape[1], query.shape[2]
    kv = cache_keys.shape[1]
    group = heads // kv
    packed = pack_queries(query, kv).double()  # [1, kv, g*q, d]
    cache_scores = _scores(packed, cache_keys, scaling)  # [1, kv, g*q, n]
    tree_scores = _scores(packed, tree_keys, scaling)  # [1, kv, g*q, t]
    if sink_query is not None:
        packed_sinks = pack_queries(sink_query, kv).double()
        if cache_sinks:
            cache_scores[..., :cache_sinks] = _scores(packed_sinks, cache_keys[:, :, :cache_sinks], scaling)
        if tree_sinks is not None:
            tree_scores = torch.where(tree_sinks, _scores(packed_sinks, tree_keys, scaling), tree_scores)
    scores = torch.cat([cache_scores, tree_scores], dim=-1)  # [1, kv, g*q, n + t]
    if cache_visible is None:
        cache_visible = torch.ones(q_len, cache_keys.shape[2], dtype=torch.bool, device=query.device)
    visible = torch.cat([cache_visible, tree_visible], dim=1).repeat(group, 1)  # row r of each head: row r % q
    scores = scores.masked_fill(~visible, float("-inf"))
    # Float64 weights of float32 scores: a kernel may take the max by parts (`attention_kernel.py`).
    weights = torch.exp(scores.double() - scores.amax(-1, keepdim=True).double())
    total = weights.sum(-1, keepdim=True)
    held = cache_keys.shape[2]
    numerator = weights[..., :held] @ cache_values.double() + weights[..., held:] @ tree_values.double()
    return unpack_output((numerator / total).to(query.dtype), heads, q_len)
