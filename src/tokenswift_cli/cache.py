"""KV caches: the full cache (every committed position) and the partial cache used for drafting.

Both are `transformers` `Cache` objects made of preallocated layers, so the stock model writes into
them through its public `past_key_values` argument. A forward writes its new keys/values *after* the
committed length without advancing it: the caller decides what to keep (`FullCache.commit`).
Keys are stored after RoPE, so a copied key keeps its original position.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers.cache_utils import Cache, CacheLayerMixin


class PreallocatedLayer(CacheLayerMixin):
    """One layer's keys and values in buffers `[1, kv_heads, capacity, head_dim]`, grown geometrically."""

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity
        self.length = 0  # committed positions

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        batch, heads, _, dim = key_states.shape
        self.keys = key_states.new_empty((batch, heads, self.capacity, dim))
        self.values = value_states.new_empty((batch, heads, self.capacity, value_states.shape[-1]))
        self.is_initialized = True

    def reserve(self, needed: int) -> None:
        """Make room for `needed` positions, doubling so that growth is amortised."""
        if needed <= self.capacity:
            return
        self.capacity = max(needed, 2 * self.capacity)
        if self.is_initialized:
            assert self.keys is not None and self.values is not None
            keys, values = self.keys, self.values
            self.keys = keys.new_empty((*keys.shape[:2], self.capacity, keys.shape[-1]))
            self.values = values.new_empty((*values.shape[:2], self.capacity, values.shape[-1]))
            self.keys[:, :, : self.length].copy_(keys[:, :, : self.length])
            self.values[:, :, : self.length].copy_(values[:, :, : self.length])

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object, **kwargs: object
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.length + key_states.shape[-2]
        self.reserve(end)
        assert self.keys is not None and self.values is not None
        self.keys[:, :, self.length : end].copy_(key_states)
        self.values[:, :, self.length : end].copy_(value_states)
        return self.keys[:, :, :end], self.values[:, :, :end]

    def get_mask_sizes(self, query_length: int, *args: object) -> tuple[int, int]:
        return self.length + query_length, 0

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return -1

    def committed(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Views `[1, kv_heads, length, head_dim]` of the committed keys and values."""
        assert self.keys is not None and self.values is not None
        return self.keys[:, :, : self.length], self.values[:, :, : self.length]


class _PreallocatedCache(Cache):
    def __init__(self, num_layers: int, capacity: int) -> None:
        super().__init__(layers=[PreallocatedLayer(capacity) for _ in range(num_layers)])

    @property
    def layer_list(self) -> list[PreallocatedLayer]:
        return self.layers  # type: ignore[return-value]

    @property
    def length(self) -> int:
        return self.layer_list[0].length

    @property
    def initialized(self) -> bool:
        return self.layer_list[0].is_initialized

    def reserve(self, needed: int) -> None:
        for layer in self.layer_list:
            layer.reserve(needed)


class FullCache(_PreallocatedCache):
    """Keys/values of every committed position, plus room for one forward's tentative positions."""

    def commit(self, kept: Sequence[int]) -> None:
        """Keep the tentative positions `kept` (offsets after the committed length, ascending).

        They are moved in place so that they follow the committed ones contiguously; the other
        tentative positions are dropped. `kept == range(k)` (plain decoding, prefill) moves nothing.
        """
        count = len(kept)
        if list(kept) != list(range(count)):
            for layer in self.layer_list:
                assert layer.keys is not None and layer.values is not None
                index = torch.tensor(kept, device=layer.keys.device) + layer.length  # [count]
                layer.keys[:, :, layer.length : layer.length + count] = layer.keys.index_select(2, index)
                layer.values[:, :, layer.length : layer.length + count] = layer.values.index_select(2, index)
        for layer in self.layer_list:
            layer.length += count

    def segment(self, layer_idx: int, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Committed keys and values of positions `[start, end)` of one layer."""
        layer = self.layer_list[layer_idx]
        assert layer.keys is not None and layer.values is not None and end <= layer.length
        return layer.keys[:, :, start:end], layer.values[:, :, start:end]

    def load_segment(self, layer_idx: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Append committed keys/values (restoring a checkpoint)."""
        layer = self.layer_list[layer_idx]
        layer.update(keys, values)
        layer.length += keys.shape[-2]


class PartialCache(_PreallocatedCache):
    """A budget of selected positions of the full cache, for the draft pass (TokenSwift section 3.2).

    Layout per layer and KV head: `sinks | selected | recent window`. Selection is per KV head, by the
    score of the latest query against every committed key (summed over the query heads of the group).
    When the window is full, `refresh` re-selects (the paper's dynamic update) and carries the most
    recent half of the window over, so that the latest context is always visible to the draft.
    """

    def __init__(self, num_layers: int, *, budget: int, sinks: int, window: int) -> None:
        super().__init__(num_layers, capacity=budget + 1)
        self.budget, self.sinks, self.window = budget, sinks, window
        self.window_start = 0  # first full-cache position held in the recent window
        self.selected: list[torch.Tensor] = []  # per layer [kv_heads, n_selected], full-cache positions

    def needs_refresh(self, full_length: int) -> bool:
        return not self.selected or full_length - self.window_start > self.window

    def refresh(self, full: FullCache, queries: Sequence[torch.Tensor]) -> None:
        """Re-select positions from `full` with the latest per-layer queries `[heads, head_dim]`."""
        n = full.length
        self.window_start = max(self.sinks, n - self.window // 2)
        n_selected = self.budget - self.sinks - self.window
        selections = []
        for layer_idx, query in enumerate(queries):
            keys, _ = full.segment(layer_idx, 0, n)
            kv_heads = keys.shape[1]
            grouped = query.view(kv_heads, -1, query.shape[-1]).to(keys.dtype)  # [kv_heads, group, head_dim]
            scores = torch.einsum("kgd,knd->kn", grouped, keys[0, :, self.sinks : self.window_start])
            top = min(n_selected, scores.shape[-1])
            chosen = scores.topk(top, dim=-1).indices.sort(dim=-1).values + self.sinks  # [kv_heads, top]
            selections.append(chosen)
        self.restore(full, selections, self.window_start)

    def restore(self, full: FullCache, selections: Sequence[torch.Tensor], window_start: int) -> None:
        """Fill the cache from `full` given a selection (refresh, or resume from a checkpoint)."""
        self.selected, self.window_start = list(selections), window_start
        for layer_idx, layer in enumerate(self.layer_list):
            keys, values = full.segment(layer_idx, 0, full.length)
            chosen = selections[layer_idx].to(keys.device)
            index = torch.cat(
                [torch.arange(self.sinks, device=keys.device).expand(chosen.shape[0], -1), chosen], dim=-1
            )  # [kv_heads, sinks + selected]
            gather = index[None, :, :, None].expand(1, -1, -1, keys.shape[-1])
            layer.length = 0
            layer.update(keys.gather(2, gather), values.gather(2, gather))
            layer.length = index.shape[-1]
            self._append(layer_idx, full, window_start, full.length)

    def append(self, full: FullCache, start: int, end: int) -> None:
        """Add newly committed full-cache positions `[start, end)` to the recent window."""
        for layer_idx in range(len(self.layer_list)):
            self._append(layer_idx, full, start, end)

    def _append(self, layer_idx: int, full: FullCache, start: int, end: int) -> None:
        layer = self.layer_list[layer_idx]
        keys, values = full.segment(layer_idx, start, end)
        layer.update(keys, values)
        layer.length += end - start
