"""The 8-bit cache's attention (`--kv-cache int8`, csrc/q8_attention.cpp): integer dot products whose
arithmetic is the one a float64 emulation here computes, for a tree's rows and a plain step's, with and
without a context window (the same bits for a row in a tree or alone: test_row_attention.py)."""

from __future__ import annotations

import pytest
import torch
from test_row_attention import CASES, HEADS, KV, TREE, _case, _reference

from tokenswift_cli.backends.cpu import row_attention as ra
from tokenswift_cli.model import kv_rows

pytestmark = pytest.mark.skipif(not ra.available(), reason="no C++ compiler for the kernel")
BLOCK = 64


def _quantised_query(q: torch.Tensor) -> torch.Tensor:
    """The query as the kernel holds it: 8-bit levels per 32 plus 8 bits of the rest (1/254 of a level)."""
    groups = q.double().unflatten(-1, (-1, 32))
    scale = groups.abs().amax(-1, keepdim=True) / 127
    scaled = groups / torch.where(scale > 0, scale, 1)
    levels = torch.round(scaled).clamp(-127, 127)
    rest = torch.round((scaled - levels) * 254).clamp(-127, 127)
    return ((levels + rest / 254) * scale).flatten(-2)


def _q8_reference(query, sink_query, keys, values, layout: ra.RowLayout, scaling: float):  # type: ignore[no-untyped-def]
    """The integer arithmetic in float64: quantised queries, 8-bit keys and values, per block of positions
    each row's weights times the values' scales rounded to 255 levels of the block's largest."""
    q_len, group, dim = query.shape[2], HEADS // KV, query.shape[3]
    wide_k = kv_rows.unpack(keys).double()
    v_levels = values[..., :dim].contiguous().view(torch.int8).double()
    v_scales = values[..., dim:].contiguous().view(torch.float32).double()  # [1, kv, n, dim / 32]
    out = torch.zeros(1, q_len, HEADS * dim, dtype=torch.float64)
    for r in range(q_len):
        nodes = [int(n) for n in layout.ancestors[r] if n >= 0]
        held = list(range(int(layout.lowest[r]), layout.stored))
        rows = list(range(layout.sinks)) + held + [layout.stored + n for n in nodes]
        ancestors = [layout.committed + t for t in range(len(nodes))]
        positions = torch.tensor([*range(layout.sinks), *(i + layout.offset for i in held), *ancestors])
        for h in range(HEADS):
            k = wide_k[0, h // group, rows]
            scores = k @ _quantised_query(query[0, h, r])
            if layout.sinks:
                scores[: layout.sinks] = k[: layout.sinks] @ _quantised_query(sink_query[0, h, r])
            scores = scores * scaling
            top = scores.max()
            numerator, denominator = torch.zeros(dim, dtype=torch.float64), 0.0
            for block in positions.div(BLOCK, rounding_mode="floor").unique():
                inside = positions.div(BLOCK, rounding_mode="floor") == block
                w = torch.exp(scores[inside] - scores[inside].max())
                factor = torch.exp(scores[inside].max() - top)
                scaled = w[:, None] * v_scales[0, h // group, [rows[i] for i in inside.nonzero().flatten()]]
                step = scaled.amax(0, keepdim=True) / 255
                u = torch.round(scaled / step)  # [positions, groups]
                levels = v_levels[0, h // group, [rows[i] for i in inside.nonzero().flatten()]].unflatten(-1, (-1, 32))
                numerator += factor * ((u[:, :, None] * levels).sum(0) * step[0, :, None]).flatten()
                denominator += factor * w.sum()
            out[0, r, h * dim : (h + 1) * dim] = numerator / denominator
    return out


def _layout_case(committed: int, window: int | None, first_recent: int, dim: int, rows: int):  # type: ignore[no-untyped-def]
    query, sink_query, keys, values, sinks = _case(committed, window, first_recent, seed=5, dim=dim)
    keys, values = kv_rows.pack(keys), kv_rows.pack(values)
    common = {"window": window, "sinks": sinks, "first_recent": first_recent or sinks, "block": BLOCK}
    if rows == 1:
        layout = ra.RowLayout.build(torch.tensor([committed]), committed, None, **common)
        query, keys, values = query[:, :, :1], keys[:, :, : layout.stored + 1], values[:, :, : layout.stored + 1]
        sink_query = sink_query[:, :, :1] if sink_query is not None else None
    else:
        layout = ra.RowLayout.build(committed + TREE.depths, committed, TREE.mask, **common)
    return query, sink_query, keys, values, layout


@pytest.mark.parametrize(("committed", "window", "first_recent"), CASES)
@pytest.mark.parametrize(("dim", "rows"), [(64, TREE.size), (32, TREE.size), (64, 1), (128, 1)])
def test_the_8bit_cache_is_read_by_integer_products(
    committed: int, window: int | None, first_recent: int, dim: int, rows: int
) -> None:
    """What the kernel computes is the emulated arithmetic (a weight may round to the other level, rarely,
    where float32 and float64 straddle a half: hence the mean), and near attention over the rows widened."""
    query, sink_query, keys, values, layout = _layout_case(committed, window, first_recent, dim, rows)
    got = ra.row_attention(query, keys, values, layout, scaling=0.2, sink_query=sink_query).double()
    emulated = _q8_reference(query, sink_query, keys, values, layout, 0.2)
    error = (got - emulated).abs()
    assert error.mean() < 1e-6 and error.max() < 5e-3
    exact = _reference(query, sink_query, kv_rows.unpack(keys), kv_rows.unpack(values), layout, 0.2)
    assert ((got - exact).norm() / exact.norm()) < 2e-2  # the 8-bit query and weights


def test_a_row_ignores_the_thread_count_and_the_cache_beyond_what_it_sees() -> None:
    """Integer sums have one value in any order: 1 and 2 threads, and rows past the new tokens, change nothing."""
    query, sink_query, keys, values, layout = _layout_case(300, 100, 4, 64, TREE.size)
    before = torch.get_num_threads()
    outs = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            outs.append(ra.row_attention(query, keys, values, layout, scaling=0.2, sink_query=sink_query))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(outs[0], outs[1])


def _tiles(keys: torch.Tensor, dim: int, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    slots = rows // kv_rows.TILE + 2
    return torch.empty((keys.shape[1], slots, kv_rows.tile_bytes(dim)), dtype=torch.uint8), torch.zeros(
        2, dtype=torch.long
    )


@pytest.mark.parametrize(("committed", "window", "first_recent"), CASES)
@pytest.mark.parametrize(("dim", "rows"), [(64, TREE.size), (32, TREE.size), (64, 1), (128, 1)])
def test_tiles_give_the_bits_of_the_rows(
    committed: int, window: int | None, first_recent: int, dim: int, rows: int
) -> None:
    """The rows laid out by tiles (a full cache's, kept across steps) are the same bits arranged otherwise:
    the same result, on the call that lays them out and on the next, which reads them."""
    query, sink_query, keys, values, layout = _layout_case(committed, window, first_recent, dim, rows)
    plain = ra.row_attention(query, keys, values, layout, scaling=0.2, sink_query=sink_query)
    tiles = _tiles(keys, dim, keys.shape[2])
    for _ in range(2):
        got = ra.row_attention(query, keys, values, layout, scaling=0.2, sink_query=sink_query, tiles=tiles)
        assert torch.equal(got, plain)
    assert tiles[1][1] == committed // kv_rows.TILE  # every complete tile of committed positions laid out


def test_tiles_follow_a_growing_and_sliding_cache() -> None:
    """Steps that commit a token each, a window that drops positions (rows move, tiles keep by position) and
    a cache restored elsewhere (`forget`) read the same bits as the rows every time."""
    dim, window, sinks, total = 64, 96, 4, 260
    torch.manual_seed(3)
    keys_all, values_all = (
        kv_rows.pack(torch.randn(1, KV, total, dim) * 2),
        kv_rows.pack(torch.randn(1, KV, total, dim)),
    )
    query = torch.randn(1, HEADS, 1, dim)
    tiles = _tiles(keys_all, dim, total)
    first_recent = sinks
    for committed in range(60, total - 1, 7):
        first_recent = max(first_recent, committed - window - 20)  # evicted in chunks, as FullCache.evict
        rows = list(range(sinks)) + list(range(first_recent, committed + 1))
        keys, values = keys_all[:, :, rows], values_all[:, :, rows]
        layout = ra.RowLayout.build(torch.tensor([committed]), committed, None, window=window, sinks=sinks,
                                    first_recent=first_recent, block=BLOCK)  # fmt: skip
        plain = ra.row_attention(query, keys, values, layout, scaling=0.2, sink_query=query)
        assert torch.equal(
            ra.row_attention(query, keys, values, layout, scaling=0.2, sink_query=query, tiles=tiles), plain
        )
        if committed == 137:  # another text at the same positions: its tiles must be laid out anew
            tiles[1].zero_()
            keys_all[:, :, 100:] = kv_rows.pack(torch.randn(1, KV, total - 100, dim))
