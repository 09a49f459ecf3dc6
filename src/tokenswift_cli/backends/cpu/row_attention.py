"""Attention over the KV cache in float32, one row at a time, by a small C++ kernel (CPU).

Each new token (a plain step's one, or a tree's nodes) attends to the sinks, the held positions its
window sees and its ancestors, in order of absolute position; its arithmetic depends on nothing else
(not the other rows, the thread count, nor whether a position sits in the cache or the tree). So it
is batch-invariant by construction, as verification needs (see exact_attention.py), and it reads
each key and value once per forward, for every row and query head of its group: at long context a
plain step is bound by reading the cache, which is what this kernel does at memory speed.

The kernel (csrc/row_attention.cpp) is compiled on first use (kernels.py); without a compiler,
`available()` is False and the callers keep the torch implementation (exact_float32.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tokenswift_cli.backends.cpu import kernels
from tokenswift_cli.model import kv_rows
from tokenswift_cli.model.cache import Tiles

BLOCK = 256


@dataclass(frozen=True)
class RowLayout:
    """What each new token sees, worked out once per forward for every layer.

    Cache rows: the sinks, then the held positions from `first_recent` (row = position - offset),
    then the new tokens. `lowest[r]` is the first held cache row token r sees; `ancestors[r, t]` the
    new token at depth t of its path (-1 past its own depth).
    """

    lowest: torch.Tensor  # [q] int64, on the CPU
    ancestors: torch.Tensor  # [q, depths] int64
    sinks: int
    stored: int  # cache rows before the new tokens
    offset: int  # position - cache row, for held positions
    committed: int
    block: int = BLOCK

    @classmethod
    def build(
        cls,
        positions: torch.Tensor,
        committed: int,
        block_mask: torch.Tensor | None,
        *,
        window: int | None = None,
        sinks: int = 0,
        first_recent: int = 0,
        block: int = BLOCK,
    ) -> RowLayout:
        """The layout for new tokens at `positions` `[q]` (a trie: `block_mask`, default causal)."""
        positions = positions.cpu()
        q_len = positions.shape[0]
        offset = first_recent - sinks
        if q_len == 1:  # a plain step (a token sees itself): in Python ints, a dozen small tensors fewer
            position = int(positions[0])
            lowest_row = max(position - window + 1 if window is not None else 0, sinks, first_recent) - offset
            ancestors = torch.full((1, position - committed + 1), -1, dtype=torch.long)
            ancestors[0, -1] = 0
            return cls(
                lowest=torch.tensor([lowest_row]), ancestors=ancestors, sinks=sinks,
                stored=sinks + committed - first_recent, offset=offset, committed=committed, block=block,
            )  # fmt: skip
        depth = positions - committed
        lowest = positions - window + 1 if window is not None else torch.zeros_like(positions)
        lowest = lowest.clamp(min=max(sinks, first_recent))
        mask = torch.ones(q_len, q_len, dtype=torch.bool).tril() if block_mask is None else block_mask.cpu()
        ancestors = torch.full((q_len, int(depth.max()) + 1), -1, dtype=torch.long)
        rows, cols = mask.nonzero(as_tuple=True)
        ancestors[rows, depth[cols]] = cols
        return cls(
            lowest=(lowest - offset).contiguous(), ancestors=ancestors, sinks=sinks,
            stored=sinks + committed - first_recent, offset=offset, committed=committed, block=block,
        )  # fmt: skip


def row_attention(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    layout: RowLayout,
    *,
    scaling: float,
    sink_query: torch.Tensor | None = None,
    tiles: Tiles | None = None,
) -> torch.Tensor:
    """Attention `[1, q, heads * d]` of rotated queries `[1, heads, q, d]` (float32, CPU).

    `keys`/`values` `[1, kv, stored + q, d]`, float32 or float16 (widened exactly as read), or 8-bit rows
    (`kv_rows.py`, with their `tiles` if the cache keeps them); `sink_query` scores the sinks (under a
    context window).
    """
    q_len, heads, dim = query.shape[2], query.shape[1], query.shape[3]
    rows = query[0].transpose(0, 1).contiguous()  # [q, heads, d]
    sink_rows = sink_query[0].transpose(0, 1).contiguous() if layout.sinks and sink_query is not None else rows
    place = (rows, sink_rows, keys[0], values[0], layout.lowest, layout.ancestors, layout.sinks, layout.stored,
             layout.offset, layout.committed, float(scaling), layout.block)  # fmt: skip
    if tiles is not None and keys.dtype == kv_rows.PACKED:
        out = kernels.load().q8_row_attention(*place, *tiles)
    else:
        out = kernels.load().row_attention(*place)
    return out.view(1, q_len, heads * dim)


def supports(head_dim: int) -> bool:
    """Whether the kernel handles this head size (whole vectors of 16 floats, up to 256)."""
    return head_dim % 16 == 0 and head_dim <= 256


def available() -> bool:
    """Whether the kernel is compiled (or compiles now); False, with a warning logged once, if it cannot."""
    return kernels.available()
