"""KV caches: the full cache (every committed position) and the partial cache used for drafting.

Both are `transformers` `Cache` objects made of preallocated layers, so the stock model writes into
them through its public `past_key_values` argument. A forward writes its new keys/values *after* the
committed length without advancing it: the caller decides what to keep (`FullCache.commit`).
Keys are stored after RoPE, so a copied key keeps its original position.

With a context window (`ContextWindow`) the full cache holds the sinks and the recent positions
only: positions that no later token can see are dropped (`FullCache.evict`), in amortised chunks.
`length` always counts positions of the text; `stored` counts the rows held.

The full cache may store its keys and values in a narrower dtype than the model computes in
(float16 for a float32 model: half the bytes a step reads at long context), or in 8 bits, each row
packed with its scales (`kv_rows.py`). Writes round to it; readers widen what they read, the same
way on every path, so every path sees the same numbers.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from tokenswift_cli.backends.transfer import upload
from tokenswift_cli.config import ContextWindow
from tokenswift_cli.model import kv_rows

Tiles = tuple[torch.Tensor, torch.Tensor]  # an 8-bit cache's rows by tiles, and which tiles are laid out


class PreallocatedLayer(CacheLayerMixin):
    """One layer's keys and values in buffers `[1, kv_heads, capacity, head_dim]`, grown geometrically."""

    def __init__(self, capacity: int, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.capacity = capacity
        self.dtype = dtype  # storage; None: as the first keys written
        self.length = 0  # committed positions
        self.dropped = 0  # positions evicted after the sinks (context window only)
        self.tiled = False  # whether 8-bit rows are also kept by tiles for the CPU kernel (a full cache's)
        self._tiles: Tiles | None = None

    @property
    def stored(self) -> int:
        """Committed positions held in the buffers."""
        return self.length - self.dropped

    @property
    def packed(self) -> bool:
        """Whether rows are stored in 8 bits with their scales (`kv_rows.py`)."""
        return self.dtype == kv_rows.STORAGE

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        batch, heads, _, dim = key_states.shape
        value_dim = value_states.shape[-1]
        if self.packed and key_states.dtype != kv_rows.PACKED:  # rows as computed: their packed width
            dim, value_dim = kv_rows.packed_width(dim), kv_rows.packed_width(value_dim)
        dtype = kv_rows.PACKED if self.packed else self.dtype or key_states.dtype
        self.keys = key_states.new_empty((batch, heads, self.capacity, dim), dtype=dtype)
        self.values = value_states.new_empty((batch, heads, self.capacity, value_dim), dtype=dtype)
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
            self.keys[:, :, : self.stored].copy_(keys[:, :, : self.stored])
            self.values[:, :, : self.stored].copy_(values[:, :, : self.stored])

    def make_room(self, count: int, like: torch.Tensor) -> None:
        """Buffers with room for `count` more rows (shaped like `like`), for a writer that fills them in place."""
        if not self.is_initialized:
            self.lazy_initialization(like, like)
        self.reserve(self.stored + count)

    def write(self, key_states: torch.Tensor, value_states: torch.Tensor) -> int:
        """Store keys/values after the stored rows (rounded to the storage dtype); returns the rows now written.

        Packed storage takes rows as computed (packed here) or as stored (another cache's, a checkpoint's);
        float storage takes packed rows widened (the partial cache of an 8-bit full cache)."""
        if key_states.dtype == kv_rows.PACKED and not self.packed:
            dtype = self.dtype or torch.float32
            key_states, value_states = kv_rows.unpack(key_states, dtype), kv_rows.unpack(value_states, dtype)
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if self.packed and key_states.dtype != kv_rows.PACKED:
            key_states, value_states = kv_rows.pack(key_states), kv_rows.pack(value_states)
        start = self.stored
        end = start + key_states.shape[-2]
        self.reserve(end)
        assert self.keys is not None and self.values is not None
        self.keys[:, :, start:end].copy_(key_states)
        self.values[:, :, start:end].copy_(value_states)
        return end

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object, **kwargs: object
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`write`, then every row written so far, in the dtype of `key_states` (the model's forward)."""
        end = self.write(key_states, value_states)
        assert self.keys is not None and self.values is not None
        keys, values = self.keys[:, :, :end], self.values[:, :, :end]
        if keys.dtype != key_states.dtype:  # a narrower storage, widened for the caller's arithmetic
            return kv_rows.widened(keys, key_states.dtype), kv_rows.widened(values, value_states.dtype)
        return keys, values

    def update_stored(self, key_states: torch.Tensor, value_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`write`, then every row written so far as stored (for a reader that widens them itself)."""
        end = self.write(key_states, value_states)
        assert self.keys is not None and self.values is not None
        return self.keys[:, :, :end], self.values[:, :, :end]

    def tiles(self) -> Tiles | None:
        """The 8-bit rows by tiles of 16 positions and what of them is laid out (`kv_rows.py`), which the
        CPU kernel extends as positions are committed; None where rows are not 8-bit or not tiled."""
        if (
            not (self.tiled and self.packed and self.is_initialized)
            or self.keys is None
            or self.keys.device.type != "cpu"
        ):
            return None
        slots = self.capacity // kv_rows.TILE + 2  # a ring of tiles by position: room for every row held
        if self._tiles is None or self._tiles[0].shape[1] != slots:
            dim = kv_rows.value_width(self.keys.shape[-1])
            layout = torch.empty((self.keys.shape[1], slots, kv_rows.tile_bytes(dim)), dtype=torch.uint8)
            self._tiles = (layout, torch.zeros(2, dtype=torch.long))  # tiles [lo, hi) laid out: none yet
        return self._tiles

    def forget_tiles(self) -> None:
        """Positions are held anew (restoring a window): no tile laid out stays valid."""
        if self._tiles is not None:
            self._tiles[1].zero_()

    def get_mask_sizes(self, query_length: int, *args: object) -> tuple[int, int]:
        return self.stored + query_length, 0

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return -1

    def committed(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Views `[1, kv_heads, stored, head_dim]` of the committed keys and values held."""
        assert self.keys is not None and self.values is not None
        return self.keys[:, :, : self.stored], self.values[:, :, : self.stored]


class _PreallocatedCache(Cache):
    def __init__(self, num_layers: int, capacity: int, dtype: torch.dtype | None = None) -> None:
        super().__init__(layers=[PreallocatedLayer(capacity, dtype) for _ in range(num_layers)])

    @property
    def layer_list(self) -> list[PreallocatedLayer]:
        return self.layers  # type: ignore[return-value]

    @property
    def length(self) -> int:
        return self.layer_list[0].length

    @property
    def initialized(self) -> bool:
        return self.layer_list[0].is_initialized

    @property
    def storage_dtype(self) -> torch.dtype | None:
        """The dtype the keys and values are stored in (None: that of the first keys written)."""
        return self.layer_list[0].dtype

    def reserve(self, needed: int) -> None:
        for layer in self.layer_list:
            layer.reserve(needed)


class FullCache(_PreallocatedCache):
    """Keys/values of every committed position (or, with a `window`, of every position still visible),
    plus room for one forward's tentative positions. `dtype`: the storage (None: the model's)."""

    def __init__(
        self, num_layers: int, capacity: int, window: ContextWindow | None = None, dtype: torch.dtype | None = None
    ) -> None:
        super().__init__(num_layers, capacity, dtype)
        self.window = window
        for layer in self.layer_list:  # a committed position's keys and values never change here: tiles keep
            layer.tiled = True

    @property
    def dropped(self) -> int:
        return self.layer_list[0].dropped

    @property
    def first_recent(self) -> int:
        """The earliest position held after the sinks (the sinks' end when nothing was dropped)."""
        sinks = self.window.sinks if self.window is not None else 0
        return min(sinks, self.length) + self.dropped

    def held(self) -> list[tuple[int, int]]:
        """The ranges `[start, end)` of positions held, in order."""
        if self.dropped == 0:
            return [(0, self.length)] if self.length else []
        assert self.window is not None
        return [(0, self.window.sinks), (self.first_recent, self.length)]

    def evict(self, *, slack: int | None = None) -> None:
        """Drop the positions that neither the next token nor any later one can see (window only).

        Waits until `slack` (default: a quarter of the window) positions can go, so that the copy of
        the window it costs is amortised over many steps.
        """
        window = self.window
        if window is None:
            return
        slack = max(1, window.size // 4) if slack is None else slack
        keep_from = self.length - window.size + 1  # the next token, at position `length`, sees from here
        drop = keep_from - self.first_recent
        if self.length <= window.sinks or drop < slack:
            return
        for layer in self.layer_list:
            assert layer.keys is not None and layer.values is not None
            start, end = window.sinks + drop, layer.stored
            kept = end - start
            layer.keys[:, :, window.sinks : window.sinks + kept] = layer.keys[:, :, start:end].clone()
            layer.values[:, :, window.sinks : window.sinks + kept] = layer.values[:, :, start:end].clone()
            layer.dropped += drop

    def skip_to(self, position: int) -> None:
        """Drop every held position after the sinks and continue at `position` (restoring a window)."""
        assert self.window is not None and self.length >= self.window.sinks and position >= self.length
        for layer in self.layer_list:
            layer.dropped, layer.length = position - self.window.sinks, position
            layer.forget_tiles()

    def commit(self, kept: Sequence[int]) -> None:
        """Keep the tentative positions `kept` (offsets after the committed length, ascending).

        They are moved in place so that they follow the committed ones contiguously; the other
        tentative positions are dropped. `kept == range(k)` (plain decoding, prefill) moves nothing.
        """
        count = len(kept)
        if list(kept) != list(range(count)):
            offsets: dict[torch.device, torch.Tensor] = {}  # one upload per device, not per layer
            for layer in self.layer_list:
                assert layer.keys is not None and layer.values is not None
                stored, device = layer.stored, layer.keys.device
                if device not in offsets:
                    offsets[device] = upload(kept, torch.long, device)
                index = offsets[device] + stored  # [count]
                layer.keys[:, :, stored : stored + count] = layer.keys.index_select(2, index)
                layer.values[:, :, stored : stored + count] = layer.values.index_select(2, index)
        for layer in self.layer_list:
            layer.length += count

    def segment(self, layer_idx: int, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Committed keys and values of positions `[start, end)` of one layer (within one held range)."""
        layer = self.layer_list[layer_idx]
        assert layer.keys is not None and layer.values is not None and end <= layer.length
        if start >= self.first_recent:
            start, end = start - layer.dropped, end - layer.dropped
        else:
            assert layer.dropped == 0 or end <= self.first_recent - layer.dropped, "positions were dropped"
        return layer.keys[:, :, start:end], layer.values[:, :, start:end]

    def load_segment(self, layer_idx: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Append committed keys/values (restoring a checkpoint)."""
        layer = self.layer_list[layer_idx]
        layer.write(keys, values)
        layer.length += keys.shape[-2]


class PartialCache(_PreallocatedCache):
    """A budget of selected positions of the full cache, for the draft pass (TokenSwift section 3.2).

    Layout per layer and KV head: `sinks | selected | recent window`. Selection is per KV head, by the
    score of the latest query against every committed key (summed over the query heads of the group).
    When the window is full, `refresh` re-selects (the paper's dynamic update) and carries the most
    recent half of the window over, so that the latest context is always visible to the draft.
    """

    def __init__(
        self, num_layers: int, *, budget: int, sinks: int, window: int, dtype: torch.dtype | None = None
    ) -> None:
        super().__init__(num_layers, capacity=budget + 1, dtype=dtype)
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
            grouped = query.view(kv_heads, -1, query.shape[-1])  # [kv_heads, group, head_dim]
            held = kv_rows.widened(keys[0, :, self.sinks : self.window_start], query.dtype)
            scores = torch.einsum("kgd,knd->kn", grouped, held)
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
            layer.write(keys.gather(2, gather), values.gather(2, gather))
            layer.length = index.shape[-1]
            self._append(layer_idx, full, window_start, full.length)

    def append(self, full: FullCache, start: int, end: int) -> None:
        """Add newly committed full-cache positions `[start, end)` to the recent window."""
        for layer_idx in range(len(self.layer_list)):
            self._append(layer_idx, full, start, end)

    def _append(self, layer_idx: int, full: FullCache, start: int, end: int) -> None:
        layer = self.layer_list[layer_idx]
        keys, values = full.segment(layer_idx, start, end)
        layer.write(keys, values)
        layer.length += end - start
