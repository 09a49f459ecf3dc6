"""The C++ row-attention kernel: attention's values (against float64), and the same bits for a token
verified in a tree or decoded alone, with and without a context window, at any thread count."""

from __future__ import annotations

import pytest
import torch

from tokenswift_cli.backends.cpu import row_attention as ra
from tokenswift_cli.engine.tree import build_tree
from tokenswift_cli.model import kv_rows

pytestmark = pytest.mark.skipif(not ra.available(), reason="no C++ compiler for the kernel")
TREE = build_tree(0, [(1, 2, 3), (4, 5), (6, 7)])  # 1 + 3 + 6 + 12 nodes, depth 3
HEADS, KV = 6, 2


def _reference(query, sink_query, keys, values, layout: ra.RowLayout, scaling: float):  # type: ignore[no-untyped-def]
    """Softmax attention in float64, each row over the cache rows the layout says it sees."""
    q_len, group, dim = query.shape[2], HEADS // KV, query.shape[3]
    out = torch.zeros(1, q_len, HEADS * dim, dtype=torch.float64)
    for r in range(q_len):
        nodes = [int(n) for n in layout.ancestors[r] if n >= 0]
        held = list(range(int(layout.lowest[r]), layout.stored))
        rows = list(range(layout.sinks)) + held + [layout.stored + n for n in nodes]
        for h in range(HEADS):
            k, v = keys[0, h // group, rows].double(), values[0, h // group, rows].double()
            q = query[0, h, r].double()
            scores = k @ q
            if layout.sinks:
                scores[: layout.sinks] = k[: layout.sinks] @ sink_query[0, h, r].double()
            weights = torch.softmax(scores * scaling, dim=0)
            out[0, r, h * dim : (h + 1) * dim] = weights @ v
    return out


def _case(committed: int, window: int | None, first_recent: int, seed: int = 0, dim: int = 64, kept: int = 4):  # type: ignore[no-untyped-def]
    """Random rotated queries, sink queries and caches; head size 64 takes the kernel's compiled-in
    path for 4 vectors per row, other sizes its general one."""
    torch.manual_seed(seed)
    sinks = kept if window else 0
    stored = sinks + committed - first_recent
    query = torch.randn(1, HEADS, TREE.size, dim)
    keys, values = torch.randn(1, KV, stored + TREE.size, dim), torch.randn(1, KV, stored + TREE.size, dim)
    sink_query = torch.randn_like(query) if window else None
    return query, sink_query, keys, values, sinks


# More kept tokens (`--keep`) than a block of keys, past the window or not: every kept block is read.
KEPT_CASES = [(700, 100, 500, 150), (400, 200, 150, 150), (230, 64, 170, 130)]


CASES = [(5, None, 0), (300, None, 0), (62, None, 0), (127, None, 0), (300, 100, 4), (700, 100, 500), (190, 64, 120)]


@pytest.mark.parametrize(("committed", "window", "first_recent"), CASES)
@pytest.mark.parametrize("dim", [64, 32, 128])
def test_row_attention_computes_attention(committed: int, window: int | None, first_recent: int, dim: int) -> None:
    query, sink_query, keys, values, sinks = _case(committed, window, first_recent, dim=dim)
    layout = ra.RowLayout.build(committed + TREE.depths, committed, TREE.mask, window=window, sinks=sinks,
                                first_recent=first_recent or sinks, block=64)  # fmt: skip
    got = ra.row_attention(query, keys, values, layout, scaling=0.2, sink_query=sink_query)
    torch.testing.assert_close(got.double(), _reference(query, sink_query, keys, values, layout, 0.2),
                               atol=2e-6, rtol=1e-5)  # fmt: skip


@pytest.mark.parametrize(("committed", "window", "first_recent"), CASES)
@pytest.mark.parametrize(("threads", "dim", "storage"), [(1, 64, "float32"), (2, 64, "float32"), (1, 32, "float32"),
                                                        (2, 64, "float16"), (1, 32, "float16"), (2, 64, "int8"),
                                                        (1, 32, "int8")])  # fmt: skip
def test_a_tree_row_gets_the_bits_of_the_same_token_decoded_alone(
    committed: int, window: int | None, first_recent: int, threads: int, dim: int, storage: str
) -> None:
    """Also from a float16 cache, which a tree's many rows read through widened copies, a plain step directly,
    and from 8-bit rows."""
    _assert_tree_rows_decode_alike(committed, window, first_recent, threads, dim, storage)


@pytest.mark.parametrize(("committed", "window", "first_recent", "kept"), KEPT_CASES)
def test_a_tree_row_gets_the_bits_of_the_same_token_decoded_alone_with_many_kept(
    committed: int, window: int, first_recent: int, kept: int
) -> None:
    _assert_tree_rows_decode_alike(committed, window, first_recent, 2, 64, "float16", kept=kept)


def _stored(x: torch.Tensor, storage: str) -> torch.Tensor:
    return kv_rows.pack(x) if storage == "int8" else x.to(getattr(torch, storage))


def _assert_tree_rows_decode_alike(
    committed: int, window: int | None, first_recent: int, threads: int, dim: int, storage: str, kept: int = 4
) -> None:
    query, sink_query, keys, values, sinks = _case(committed, window, first_recent, seed=committed, dim=dim, kept=kept)
    keys, values = _stored(keys, storage), _stored(values, storage)
    first_recent = first_recent or sinks
    positions = committed + TREE.depths
    common = {"window": window, "sinks": sinks, "first_recent": first_recent, "block": 64}
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        layout = ra.RowLayout.build(positions, committed, TREE.mask, **common)
        tree_out = ra.row_attention(query, keys, values, layout, scaling=0.2, sink_query=sink_query)
        stored = layout.stored
        for row in range(TREE.size):
            path = torch.nonzero(TREE.mask[row]).flatten()  # ancestors and itself, by depth
            depth = int(TREE.depths[row])
            order = torch.cat([torch.arange(stored), stored + path])  # the ancestors now held in the cache
            alone_layout = ra.RowLayout.build(positions[row : row + 1], committed + depth, None, **common)
            alone = ra.row_attention(
                query[:, :, row : row + 1], keys[:, :, order], values[:, :, order], alone_layout, scaling=0.2,
                sink_query=sink_query[:, :, row : row + 1] if sink_query is not None else None,
            )  # fmt: skip
            assert torch.equal(alone[:, 0], tree_out[:, row]), row
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize(("committed", "window", "first_recent", "kept"), KEPT_CASES)
def test_row_attention_sees_every_kept_token(committed: int, window: int, first_recent: int, kept: int) -> None:
    query, sink_query, keys, values, sinks = _case(committed, window, first_recent, kept=kept)
    layout = ra.RowLayout.build(committed + TREE.depths, committed, TREE.mask, window=window, sinks=sinks,
                                first_recent=first_recent, block=64)  # fmt: skip
    got = ra.row_attention(query, keys, values, layout, scaling=0.2, sink_query=sink_query)
    torch.testing.assert_close(got.double(), _reference(query, sink_query, keys, values, layout, 0.2),
                               atol=2e-6, rtol=1e-5)  # fmt: skip


def test_row_attention_reads_strided_caches() -> None:
    """The engine's caches are views of a preallocated buffer: rows with a stride past their length."""
    query, _, keys, values, _ = _case(100, None, 0)
    buffer = torch.randn(1, KV, 400, 64)
    buffer[:, :, : keys.shape[2]] = keys
    values_buffer = torch.randn(1, KV, 400, 64)
    values_buffer[:, :, : values.shape[2]] = values
    layout = ra.RowLayout.build(100 + TREE.depths, 100, TREE.mask)
    got = ra.row_attention(query, buffer[:, :, : keys.shape[2]], values_buffer[:, :, : keys.shape[2]], layout,
                           scaling=0.2)  # fmt: skip
    assert torch.equal(got, ra.row_attention(query, keys, values, layout, scaling=0.2))


@pytest.mark.parametrize(("committed", "window", "first_recent"), CASES)
@pytest.mark.parametrize("dim", [64, 32])
def test_a_float16_cache_reads_as_its_values_widened(
    committed: int, window: int | None, first_recent: int, dim: int
) -> None:
    """Stored in float16 and computed in float32: the bits of the same values stored in float32."""
    query, sink_query, keys, values, sinks = _case(committed, window, first_recent, seed=3, dim=dim)
    keys, values = (x.half() for x in (keys, values))
    layout = ra.RowLayout.build(committed + TREE.depths, committed, TREE.mask, window=window, sinks=sinks,
                                first_recent=first_recent or sinks, block=64)  # fmt: skip
    got = ra.row_attention(query, keys, values, layout, scaling=0.2, sink_query=sink_query)
    widened = ra.row_attention(query, keys.float(), values.float(), layout, scaling=0.2, sink_query=sink_query)
    assert got.dtype == torch.float32 and torch.equal(got, widened)


@pytest.mark.parametrize("family", ["llama-mha", "qwen2"])  # head size 16: the kernel's
def test_tokenswift_equals_plain_through_the_kernel(family: str, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from conftest import tiny_model
    from helpers import assert_windowed_sampling_is_lossless

    from tokenswift_cli.backends.cpu import invariant
    from tokenswift_cli.backends.cpu.int4 import quantize_decoder
    from tokenswift_cli.model.target import Target

    calls: list[int] = []

    def counted(query, *args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(query.shape[2])
        return ra.row_attention(query, *args, **kwargs)

    monkeypatch.setattr(invariant, "row_attention", counted)
    model = tiny_model(family)
    quantize_decoder(model)  # 4-bit weights: float32 verification runs exactly, here through the kernel
    target = Target(model)
    assert target.row_kernel
    target.backend.native = None  # the layers in Python, calling the kernel (test_native_decoder.py: in C++)
    assert_windowed_sampling_is_lossless(target)
    assert 1 in calls and max(calls) > 1  # plain steps and trees both ran through it


def q8_weight(rows: int, columns: int, seed: int = 0, scale: float = 0.01) -> torch.Tensor:
    """A float32 matrix that is exactly a Q8_0 tensor: int8 values times a float16 scale per 32."""
    generator = torch.Generator().manual_seed(seed)
    values = torch.randint(-127, 128, (rows, columns // 32, 32), generator=generator).float()
    values[..., 0] = 127  # the largest magnitude of each group, as Q8_0 quantisation leaves it
    scales = (torch.rand(rows, columns // 32, 1, generator=generator) * scale + 1e-4).half().float()
    return (values * scales).reshape(rows, columns)


def test_q8_head_recovers_q8_0_and_gives_each_row_its_own_logits() -> None:
    from tokenswift_cli.backends.cpu.q8_head import Q8Head

    weight = q8_weight(301, 64)  # a vocabulary that is no multiple of the 4 rows stored together
    head = Q8Head.from_weight(weight)
    assert head is not None and head.packed.dtype == torch.uint8
    assert torch.equal(head.values().float() * head.group_scales().repeat_interleave(32, dim=1), weight)
    assert Q8Head.from_weight(torch.randn(300, 64)) is None  # not a Q8_0 tensor: the float32 head stays
    chunked = Q8Head.from_weight(weight, rows=64)  # converted 64 rows at a time, the last part shorter
    assert chunked is not None and torch.equal(chunked.packed, head.packed) and torch.equal(chunked.scales, head.scales)
    broken = weight.clone()
    broken[299, 5] += 1e-3  # one value off the grid, in the last part
    assert Q8Head.from_weight(broken, rows=64) is None
    hidden = torch.randn(19, 64)  # rows go through the head 4 at a time
    logits = head.logits(hidden)
    assert logits.shape == (19, 301)
    from test_int4 import quantised_activations

    xq, dx, _ = quantised_activations(hidden)  # the hidden state at 8 bits: the product up to float32 rounding
    exact = (xq * dx[..., None]).view(19, 64).double() @ weight.double().T
    torch.testing.assert_close(logits, exact.float(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(logits, hidden @ weight.T, atol=0.2, rtol=0.05)
    for row in range(19):  # batch-invariant: alone, a row gets the same bits
        assert torch.equal(head.logits(hidden[row : row + 1])[0], logits[row])


def test_q8_logits_follow_their_documented_order_bit_for_bit() -> None:
    from test_int4 import products_reference

    from tokenswift_cli.backends.cpu.q8_head import Q8Head

    head = Q8Head.from_weight(q8_weight(1000, 576, seed=3, scale=0.2))
    assert head is not None
    hidden = torch.randn(10, 576, generator=torch.Generator().manual_seed(4))
    expected = products_reference(hidden, head.values(), head.group_scales())
    for rows in (1, 2, 3, 10):  # the kernel's row tiles
        got = head.logits(hidden[:rows])
        assert (got != expected[:rows]).sum() <= 1, "the head's arithmetic changed order on this CPU"


def test_tokenswift_equals_plain_with_a_q8_head() -> None:
    from conftest import tiny_model
    from helpers import first_divergence, random_heads, random_prompt

    from tokenswift_cli.backends.cpu.int4 import quantize_decoder
    from tokenswift_cli.config import RunConfig, SamplingConfig
    from tokenswift_cli.engine.decode import generate_tokens
    from tokenswift_cli.model.target import Target

    model = tiny_model("qwen2")
    with torch.no_grad():
        head = model.get_output_embeddings()
        head.weight.copy_(q8_weight(*head.weight.shape, seed=1, scale=0.4))
    quantize_decoder(model)
    target = Target(model)
    assert target.q8_head is not None
    heads, prompt = random_heads(target), random_prompt(60)
    cfg = RunConfig(max_new_tokens=120, sampling=SamplingConfig(temperature=1.0, min_p=0.05, seed=2))
    plain, _ = generate_tokens(target, None, prompt, cfg.replace(mode="plain"))
    fast, stats = generate_tokens(target, heads, prompt, cfg)
    assert first_divergence(fast, plain) is None and stats.iterations < 120


@pytest.mark.parametrize("window", [None, 64])
@pytest.mark.parametrize("sinks, first_recent", [(0, 0), (4, 0), (4, 40)])
def test_a_single_rows_layout_is_the_general_one(window: int | None, sinks: int, first_recent: int) -> None:
    """A plain step's layout, worked out in Python ints, equals the general path's (a trie of one row)."""
    for committed in (0, 1, 63, 64, 65, 200):
        for depth in (0, 1, 3):
            position = torch.tensor([committed + depth])
            single = ra.RowLayout.build(
                position, committed, None, window=window, sinks=sinks, first_recent=first_recent
            )
            lowest = (position - window + 1 if window is not None else torch.zeros_like(position)).clamp(
                min=max(sinks, first_recent)
            ) - (first_recent - sinks)
            assert torch.equal(single.lowest, lowest)
            expected = torch.full((1, depth + 1), -1, dtype=torch.long)
            expected[0, depth] = 0
            assert torch.equal(single.ancestors, expected)
            assert (single.stored, single.offset) == (sinks + committed - first_recent, first_recent - sinks)
