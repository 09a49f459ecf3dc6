"""8-bit keys and values (`--kv-cache int8`, model/kv_rows.py): the rounding, and rows that keep their
scales through every move of the cache (commit, evict, segments, the partial cache)."""

from __future__ import annotations

import pytest
import torch

from tokenswift_cli.config import ContextWindow
from tokenswift_cli.model import kv_rows
from tokenswift_cli.model.cache import FullCache, PartialCache


def _rows(*shape: int, seed: int = 0) -> torch.Tensor:
    torch.manual_seed(seed)
    return torch.randn(*shape) * torch.rand(*shape[:-1], 1) * 4  # rows of different sizes


def test_a_packed_row_holds_each_value_within_half_its_groups_step() -> None:
    x = _rows(3, 50, 64)
    x[0, 0] = 0.0  # a row of zeros: scale 0, widened to zeros
    packed = kv_rows.pack(x)
    assert packed.dtype == torch.uint8 and packed.shape == (3, 50, kv_rows.packed_width(64)) == (3, 50, 72)
    widened = kv_rows.unpack(packed)
    step = x.unflatten(-1, (-1, 32)).abs().amax(-1, keepdim=True) / 127
    assert ((widened - x).unflatten(-1, (-1, 32)).abs() <= step / 2 * (1 + 1e-6)).all()
    assert torch.equal(widened[0, 0], torch.zeros(64))
    assert torch.equal(kv_rows.pack(widened), packed)  # widened values pack back to the same bytes
    with pytest.raises(ValueError, match="multiple of 32"):
        kv_rows.packed_width(48)


def test_rows_keep_their_scales_through_commit_evict_and_segments() -> None:
    window = ContextWindow(size=40, sinks=4)
    cache = FullCache(2, capacity=16, window=window, dtype=kv_rows.STORAGE)  # grows: rows are copied
    everything_k, everything_v = [], []
    for step in range(30):
        keys, values = _rows(1, 2, 5, 64, seed=2 * step), _rows(1, 2, 5, 64, seed=2 * step + 1)
        kept = [0, 2, 3] if step % 2 else [1]  # tree-like: moved rows, then plain-like
        for layer in cache.layer_list:
            widened_k, widened_v = layer.update(keys, values)  # what the model's forward reads
            assert widened_k.dtype == torch.float32 and torch.equal(
                widened_k[:, :, -5:], kv_rows.unpack(kv_rows.pack(keys))
            )
            assert torch.equal(widened_v[:, :, -5:], kv_rows.unpack(kv_rows.pack(values)))
        cache.commit(kept)
        cache.evict()
        everything_k.append(kv_rows.unpack(kv_rows.pack(keys))[:, :, kept])
        everything_v.append(kv_rows.unpack(kv_rows.pack(values))[:, :, kept])
    all_k, all_v = torch.cat(everything_k, dim=2), torch.cat(everything_v, dim=2)
    assert cache.dropped > 0 and cache.layer_list[0].keys.dtype == torch.uint8
    for start, end in cache.held():
        keys, values = cache.segment(1, start, end)
        assert torch.equal(kv_rows.unpack(keys), all_k[:, :, start:end])
        assert torch.equal(kv_rows.unpack(values), all_v[:, :, start:end])
    restored = FullCache(2, capacity=8, dtype=kv_rows.STORAGE)  # a checkpoint's segments, as stored
    for i in range(2):
        restored.load_segment(i, *cache.segment(i, 0, window.sinks))
    assert torch.equal(restored.layer_list[1].committed()[0], cache.segment(1, 0, window.sinks)[0])


def test_the_partial_cache_of_an_8bit_cache_holds_its_rows_widened() -> None:
    full = FullCache(1, capacity=64, dtype=kv_rows.STORAGE)
    keys, values = _rows(1, 2, 60, 64, seed=7), _rows(1, 2, 60, 64, seed=8)
    full.layer_list[0].update(keys, values)
    full.commit(range(60))
    partial = PartialCache(1, budget=24, sinks=4, window=8, dtype=torch.float32)
    partial.refresh(full, [torch.randn(4, 64)])
    held = partial.layer_list[0].committed()[0]
    assert held.dtype == torch.float32
    index = torch.cat([torch.arange(4).expand(2, -1), partial.selected[0]], dim=-1)
    expected = kv_rows.unpack(full.segment(0, 0, 60)[0])[0].gather(1, index[:, :, None].expand(-1, -1, 64))
    assert torch.equal(held[0, :, : index.shape[1]], expected)
