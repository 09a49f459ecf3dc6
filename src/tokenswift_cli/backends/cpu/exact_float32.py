"""Batch-invariant attention in float32, at about the cost of the fast path.

The same contract as `exact_attention.py` (a token verified in a tree gets the bits it gets decoded
alone), with what float32 matrix products allow on this CPU (MKL, measured): a row of `q @ K^T` is
the same bits for any number of rows >= 3 and keys >= 4, and a row of `P @ V` with a 256-long
reduction for any number of rows >= 2. An AMD EPYC with AVX-512 needs more: rows >= 4 for both,
and keys >= 12 for the scores. So every product is padded to `MIN_ROWS` x `MIN_KEYS` at least, with
no per-row copy of the cache:

* scores are one product over the held keys and one over the new keys (a row's score for a
  position does not depend on whether the cache or the tree holds it);
* `P @ V` runs per block of `BLOCK` absolute positions for the blocks wholly before `committed`;
  the block a row's own position falls in (its cached tail and its ancestors: a few hundred terms
  at most) is summed in float64, like the sums over blocks, where order no longer shows after
  rounding back;
* a row whose ancestors spill back into the block before its own (a tree crossing a block edge)
  gets that block as plain decoding saw it, whole: one product with the row's own values.

Everything that depends only on the positions is worked out once per forward (`Float32Layout`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tokenswift_cli.model.attention import pack_queries, unpack_output

BLOCK = 256
MIN_ROWS = 4  # floors of the products (measured, by CPU: 3-4 rows, 4-12 keys), padded up to
MIN_KEYS = 16


@dataclass(frozen=True)
class Float32Layout:
    """Where each score and value of one forward comes from; the same for every layer.

    Score column j is absolute position `start + j`: held positions up to `committed`, then one
    column per depth of the new tokens (each row's ancestor at that depth).
    """

    start: int  # first position of the first block any row sees
    committed: int
    sinks: int
    first_recent: int  # the first position held after the sinks
    block: int
    q_len: int
    invisible: torch.Tensor | None  # [g*q, columns] score columns a row does not see (None: it sees all)
    ancestors: torch.Tensor | None  # [1, 1, g*q, depths] the node at each depth of each row (None: one token)
    tail_rows: torch.Tensor | None  # [g*q, 1]: rows whose own block holds `committed` (None: all of them)
    own_depths: torch.Tensor | None  # [g*q, depths]: new positions in each row's own block (None: all)
    crossing: tuple[tuple[int, torch.Tensor], ...]  # (row, its nodes in the block of `committed`)

    @classmethod
    def build(
        cls,
        positions: torch.Tensor,
        committed: int,
        block_mask: torch.Tensor | None,
        *,
        group: int,
        window: int | None = None,
        sinks: int = 0,
        first_recent: int = 0,
        block: int = BLOCK,
    ) -> Float32Layout:
        """The layout for new tokens at `positions` `[q]` (a trie: `block_mask`, default causal)."""
        device, q_len = positions.device, positions.shape[0]
        lowest = positions - window + 1 if window is not None else torch.zeros_like(positions)
        lowest = lowest.clamp(min=sinks)  # [q]: the first recent position each row sees
        first = min(int(lowest.min()), committed)
        assert first >= first_recent or first >= committed, "a needed position was dropped"
        depth = positions - committed
        depths = int(depth.max()) + 1
        assert depths <= block, "a tree deeper than a block"
        start = first // block * block
        columns = torch.arange(start, committed + depths, device=device)
        invisible = (columns[None] < lowest[:, None]) | (columns[None] > positions[:, None])  # [q, columns]
        ancestors, tail_rows, own_depths, crossing = None, None, None, []
        if q_len > 1:
            mask = torch.ones(q_len, q_len, dtype=torch.bool).tril() if block_mask is None else block_mask.cpu()
            path = torch.zeros(q_len, depths, dtype=torch.long)
            rows, cols = mask.nonzero(as_tuple=True)
            path[rows, depth.cpu()[cols]] = cols
            ancestors = path.repeat(group, 1)[None, None].to(device)
            own_block = positions.cpu() // block
            tail_block = committed // block
            if bool((own_block > tail_block).any()):
                own_block = own_block.repeat(group)
                tail_rows = (own_block == tail_block)[:, None].to(device)
                new_blocks = torch.arange(committed, committed + depths) // block
                own_depths = (new_blocks[None] >= own_block[:, None]).to(device)
                spill = (tail_block + 1) * block - committed  # depths that fall in the block of `committed`
                crossing = [(row, path[row % q_len, :spill].to(device)) for row in range(group * q_len)
                            if own_block[row] > tail_block]  # fmt: skip
        return cls(
            start=start, committed=committed, sinks=sinks, first_recent=first_recent, block=block, q_len=q_len,
            invisible=invisible.repeat(group, 1) if bool(invisible.any()) else None, ancestors=ancestors,
            tail_rows=tail_rows, own_depths=own_depths, crossing=tuple(crossing),
        )  # fmt: skip

    def held(self, start: int, end: int) -> slice:
        """Cache rows of the held positions [start, end)."""
        return slice(self.sinks + start - self.first_recent, self.sinks + end - self.first_recent)


def exact_attention_float32(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    layout: Float32Layout,
    *,
    scaling: float,
    sink_query: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention `[1, q, heads * d]` of rotated queries `[1, heads, q, d]`, batch-invariant in float32.

    `keys`/`values` `[1, kv, stored + q, d]`: the sinks, the held positions, then the new tokens.
    """
    heads, q_len = query.shape[1], query.shape[2]
    kv, at = keys.shape[1], layout
    stored = at.sinks + at.committed - at.first_recent
    packed = pack_queries(query, kv)  # [1, kv, g*q, d]
    held_from = max(at.start, at.first_recent)  # positions before it were dropped: scores of -inf
    new_scores = _scores(packed, keys[:, :, stored:])  # [1, kv, g*q, q]
    if at.ancestors is not None:
        new_scores = new_scores.gather(-1, at.ancestors.expand(1, kv, -1, -1))
    scores = torch.cat([_scores(packed, keys[:, :, at.held(held_from, at.committed)]), new_scores], dim=-1)
    if held_from > at.start:
        scores = F.pad(scores, (held_from - at.start, 0), value=float("-inf"))
    scores.mul_(scaling)
    if at.invisible is not None:
        scores.masked_fill_(at.invisible, float("-inf"))
    top = scores.amax(-1, keepdim=True)
    sink_scores = None
    if at.sinks:
        assert sink_query is not None
        sink_keys = keys[:, :, None, : at.sinks]  # [1, kv, 1, s, d]: a few keys, summed over one axis
        sink_scores = (pack_queries(sink_query, kv)[:, :, :, None] * sink_keys).sum(-1) * scaling
        top = torch.maximum(top, sink_scores.amax(-1, keepdim=True))
    weights = scores.sub_(top).exp_()  # [1, kv, g*q, columns]
    total = weights.sum(-1, dtype=torch.float64)
    numerator = _numerator(weights, values, at, stored)
    if sink_scores is not None:
        sink_weights = torch.exp(sink_scores - top)
        total += sink_weights.sum(-1, dtype=torch.float64)
        numerator += (sink_weights[..., None] * values[:, :, None, : at.sinks]).sum(-2).double()
    out = (numerator / total[..., None]).to(query.dtype)
    return unpack_output(out, heads, q_len)


def _numerator(weights: torch.Tensor, values: torch.Tensor, at: Float32Layout, stored: int) -> torch.Tensor:
    """`weights @ values` `[1, kv, g*q, d]` in float64, laid out by absolute position."""
    block, committed = at.block, at.committed
    tail_start = committed // block * block
    wholes = (tail_start - at.start) // block
    numerator = torch.zeros(*weights.shape[:3], values.shape[-1], dtype=torch.float64, device=weights.device)
    if wholes:
        block_weights = weights[..., : tail_start - at.start].unflatten(-1, (wholes, block)).transpose(2, 3)
        split = 1 if at.start < at.first_recent else 0  # the first block reaches back past what is held
        if split:
            numerator += _blocks(
                block_weights[:, :, :1], _held_values(values, at, at.start, at.start + block)[:, :, None]
            )
        if wholes > split:
            rest = values[:, :, at.held(at.start + split * block, tail_start)].unflatten(2, (wholes - split, block))
            numerator += _blocks(block_weights[:, :, split:], rest)
    tail_from = max(tail_start, at.start, at.first_recent)
    tail_weights = weights[..., tail_from - at.start : committed - at.start]
    if at.tail_rows is not None:
        tail_weights = tail_weights * at.tail_rows
    numerator += tail_weights.double() @ values[:, :, at.held(tail_from, committed)].double()
    new_weights = weights[..., committed - at.start :]  # [1, kv, g*q, depths]
    if at.own_depths is not None:
        new_weights = new_weights * at.own_depths
    if at.ancestors is not None:  # per node: each row's weight for its ancestor at each depth
        nodes = new_weights.new_zeros(*weights.shape[:3], at.q_len)
        new_weights = nodes.scatter_add_(-1, at.ancestors.expand(1, weights.shape[1], -1, -1), new_weights)
    numerator += new_weights.double() @ values[:, :, stored:].double()
    for row, path in at.crossing:  # the whole block before the row's own, with the row's ancestors in it
        row_values = torch.cat([_held_values(values, at, tail_start, committed), values[:, :, stored + path]], dim=2)
        row_weights = weights[:, :, row : row + 1, tail_start - at.start : tail_start - at.start + block]
        numerator[:, :, row : row + 1] += _blocks(row_weights[:, :, None], row_values[:, :, None])
    return numerator


def _scores(packed: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """`packed @ keys^T` `[1, kv, r, n]` through a product of at least `MIN_ROWS` x `MIN_KEYS`."""
    rows, length = packed.shape[2], keys.shape[2]
    return (_pad(packed, MIN_ROWS, 2) @ _pad(keys, MIN_KEYS, 2).transpose(-1, -2))[:, :, :rows, :length]


def _blocks(weights: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """weights `[1, kv, nb, r, B]` @ values `[1, kv, nb, B, d]`, summed over the blocks in float64."""
    rows = weights.shape[3]
    weights = _pad(weights, MIN_ROWS, 3)
    per_head = [weights[0, head] @ values[0, head] for head in range(weights.shape[1])]  # [nb, r, d] each
    return torch.stack(per_head)[None, :, :, :rows].sum(2, dtype=torch.float64)


def _held_values(values: torch.Tensor, at: Float32Layout, start: int, end: int) -> torch.Tensor:
    """Values of positions [start, end) `[1, kv, end - start, d]`, zeros for those no longer held."""
    dropped = max(0, min(at.first_recent, end) - start)
    part = values[:, :, at.held(start + dropped, end)]
    return F.pad(part, (0, 0, dropped, 0)) if dropped else part


def _pad(x: torch.Tensor, rows: int, dim: int) -> torch.Tensor:
    """`x` with zero rows appended along `dim` up to `rows`."""
    missing = rows - x.shape[dim]
    if missing <= 0:
        return x
    return F.pad(x, (0, 0) * (x.dim() - 1 - dim) + (0, missing))
