"""parallel.h's split: every index once, whatever the thread count; errors reach the caller; a forked child
gets its own pool; the kernels built on it give the same bits on any number of threads."""

from __future__ import annotations

import multiprocessing

import pytest
import torch
from test_int4 import q4_linear

from tokenswift_cli.backends.cpu import kernels
from tokenswift_cli.backends.cpu.int4 import Int4Linear

pytestmark = pytest.mark.skipif(not kernels.available(), reason="needs the C++ kernels")


@pytest.fixture
def threads():  # type: ignore[no-untyped-def]
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


@pytest.mark.parametrize("count", [1, 2, 3, 5])
@pytest.mark.parametrize(("size", "grain"), [(1, 1), (7, 1), (64, 16), (100, 3), (1000, 1), (4099, 16)])
def test_every_index_is_visited_once(threads, count: int, size: int, grain: int) -> None:  # type: ignore[no-untyped-def]
    threads(count)
    module = kernels.load()
    for _ in range(20):  # jobs back to back, as a step makes them
        assert torch.equal(module.split_counts(size, grain, -1), torch.ones(size, dtype=torch.long))


def test_a_failing_chunk_raises_in_the_caller_and_the_pool_goes_on(threads) -> None:  # type: ignore[no-untyped-def]
    threads(2)
    module = kernels.load()
    for fail_at in (0, 99, 50):
        with pytest.raises(RuntimeError, match="a chunk failed"):
            module.split_counts(100, 1, fail_at)
    assert torch.equal(module.split_counts(100, 1, -1), torch.ones(100, dtype=torch.long))


def _child_counts(size: int) -> bool:
    torch.set_num_threads(2)
    return bool(torch.equal(kernels.load().split_counts(size, 1, -1), torch.ones(size, dtype=torch.long)))


def test_a_forked_child_has_a_pool_of_its_own(threads) -> None:  # type: ignore[no-untyped-def]
    threads(2)
    assert torch.equal(kernels.load().split_counts(500, 1, -1), torch.ones(500, dtype=torch.long))  # helpers started
    with multiprocessing.get_context("fork").Pool(1) as pool:
        assert pool.apply_async(_child_counts, (500,)).get(timeout=60)


def test_products_have_the_same_bits_on_any_thread_count(threads) -> None:  # type: ignore[no-untyped-def]
    layer = Int4Linear.from_linear(q4_linear(1000, 576, seed=3))[0]
    x = torch.randn(5, 576, generator=torch.Generator().manual_seed(0))
    outs = []
    for count in (1, 2, 3):
        threads(count)
        outs.append([layer(x[:rows]) for rows in (1, 5)])
    for other in outs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(outs[0], other, strict=True))
