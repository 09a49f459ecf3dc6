"""The lean backend: the decoder's own modules called layer by layer (gpt-fast style), on any device.

It skips the framework's mask building and cache bookkeeping, which cost more than the weights at
short context on a CPU, and attends with the fast path of `model/attention.py` (or, under a context
window, its window attention). It knows the layout of llama, qwen2 and mistral without sliding
windows; other models take the stock backend.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar, Protocol

import torch
from transformers import PreTrainedModel
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb, rotate_half

from tokenswift_cli.backends.base import Backend
from tokenswift_cli.config import ContextWindow
from tokenswift_cli.model.attention import attend, window_attention
from tokenswift_cli.model.cache import FullCache, PreallocatedLayer, Tiles, _PreallocatedCache
from tokenswift_cli.model.forward import Forward, QueryCapture

LEAN_FAMILIES = ("llama", "qwen2", "mistral")

Rotation = tuple[torch.Tensor, torch.Tensor]  # cos, sin


def supports_lean(model: PreTrainedModel) -> bool:
    """The lean forward knows this layout: a supported family, full attention in every layer."""
    config = model.config
    sliding = getattr(config, "sliding_window", None) if getattr(config, "use_sliding_window", True) else None
    layer_types = set(getattr(config, "layer_types", None) or ["full_attention"])
    return config.model_type in LEAN_FAMILIES and sliding is None and layer_types == {"full_attention"}


class Attention(Protocol):
    """How every layer of one forward attends and applies its row-wise modules (worked out once per forward)."""

    @property
    def reads_storage(self) -> bool:
        """Whether it takes the cache's rows as stored (float16, 8-bit), not widened to the model's dtype."""
        ...

    def rows(self, module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        """A row-wise module (projection, MLP) on `x` `[1, q, features]`."""
        ...

    def attend(
        self,
        raw_query: torch.Tensor,
        query: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        *,
        stored: int,
        scaling: float,
        tiles: Tiles | None = None,
    ) -> torch.Tensor:
        """Attention `[1, q, heads * d]` of `query` `[1, heads, q, d]` (rotated; `raw_query` before rotation)
        over `keys`/`values` `[1, kv_heads, stored + q, d]` (`tiles`: an 8-bit cache's, for a kernel that
        reads them)."""
        ...

    def to(self, device: torch.device) -> Attention:
        """The same attention with its tensors on `device` (a layer on another device, `--device auto`)."""
        ...


@dataclass(frozen=True)
class FastAttention:
    """The fast kernels, under a context window or not; also what the other attentions need to know."""

    positions: torch.Tensor  # [q]
    block_mask: torch.Tensor | None
    window: ContextWindow | None
    committed: int  # positions of the text before the new tokens
    first_recent: int  # the first position held after the sinks (see `FullCache.first_recent`)
    sink_rotation: Rotation | None  # cos/sin at min(position, window span - 1)
    reads_storage: ClassVar[bool] = False

    def rows(self, module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        return module(x)

    def to(self, device: torch.device) -> FastAttention:
        mask, rotation = self.block_mask, self.sink_rotation
        return dataclasses.replace(
            self, positions=self.positions.to(device), block_mask=None if mask is None else mask.to(device),
            sink_rotation=None if rotation is None else (rotation[0].to(device), rotation[1].to(device)),
        )  # fmt: skip

    def sink_query(self, raw_query: torch.Tensor) -> torch.Tensor | None:
        """The query rotated as if the sinks sat just before its window (None: no rotation asked)."""
        if self.sink_rotation is None:
            return None
        cos, sin = self.sink_rotation
        return raw_query * cos + rotate_half(raw_query) * sin

    def attend(
        self,
        raw_query: torch.Tensor,
        query: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        *,
        stored: int,
        scaling: float,
        tiles: Tiles | None = None,
    ) -> torch.Tensor:
        sink_query = self.sink_query(raw_query)
        if sink_query is None:
            return attend(query, keys, values, committed=stored, block_mask=self.block_mask, scaling=scaling)
        window = self.window
        assert window is not None
        return window_attention(
            query, sink_query, keys, values, positions=self.positions, committed=self.committed,
            first_recent=self.first_recent, sinks=window.sinks, size=window.size, block_mask=self.block_mask,
            scaling=scaling,
        )  # fmt: skip


class LeanBackend(Backend):
    """The layer loop with the fast attention; a subclass may choose another `Attention` per forward."""

    lean = True

    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        cache: _PreallocatedCache,
        *,
        block_mask: torch.Tensor | None,
        capture: QueryCapture | None,
        exact: bool,
    ) -> Forward:
        """The decoder's computation through its own modules, without masks or cache bookkeeping."""
        x = self.decoder.embed_tokens(tokens[None])  # [1, q, hidden]
        rotary = self.decoder.rotary_emb(x, positions)
        attention = self.attention(x, positions, cache, block_mask=block_mask, exact=exact)
        return self.layers(x, rotary, cache, attention, capture)

    def attention(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        cache: _PreallocatedCache,
        *,
        block_mask: torch.Tensor | None,
        exact: bool,
    ) -> Attention:
        """How this forward's layers attend: the fast kernels (`exact` is a CPU matter: `backends/cpu/invariant.py`)."""
        return self.fast_attention(x, positions, cache, block_mask, rotate_sinks=False)

    def fast_attention(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        cache: _PreallocatedCache,
        block_mask: torch.Tensor | None,
        *,
        rotate_sinks: bool,
    ) -> FastAttention:
        """The fast attention of this forward. The sink queries are rotated once a position passes the
        window's span, or always with `rotate_sinks` (exact attention reads them from the start)."""
        window = cache.window if isinstance(cache, FullCache) else None
        first_recent = cache.first_recent if isinstance(cache, FullCache) else 0
        sink_rotation = None
        if window is not None and (rotate_sinks or int(positions.max()) >= window.span):
            sink_cos, sink_sin = self.decoder.rotary_emb(x, positions.clamp(max=window.span - 1))
            sink_rotation = (sink_cos[:, None], sink_sin[:, None])
        return FastAttention(positions[0], block_mask, window, cache.length, first_recent, sink_rotation)

    def layers(
        self,
        x: torch.Tensor,
        rotary: Rotation,
        cache: _PreallocatedCache,
        attention: Attention,
        capture: QueryCapture | None,
    ) -> Forward:
        """Every decoder layer, then the final norm.

        Under `--device auto` the layers may sit on several devices, and accelerate's hooks move the
        inputs of the modules it hooked (whole layers), not of the ones called here: the residual
        stream, the rotation and the attention's tensors follow each layer to its device.
        """
        for index, (layer, device) in enumerate(zip(self.decoder.layers, self.layer_devices, strict=True)):
            if x.device != device:
                x, rotary, attention = x.to(device), (rotary[0].to(device), rotary[1].to(device)), attention.to(device)
            x = self._layer(layer, x, rotary, cache.layer_list[index], attention=attention, capture=capture)
        x = x.to(self.output_device)
        return Forward(pre_norm=x[0], hidden=self.decoder.norm(x)[0])

    def _layer(
        self,
        layer: torch.nn.Module,
        x: torch.Tensor,
        rotary: Rotation,
        cache: PreallocatedLayer,
        *,
        attention: Attention,
        capture: QueryCapture | None,
    ) -> torch.Tensor:
        """One decoder layer (pre-norm attention + MLP), as the family's own `forward` computes it."""
        attn = layer.self_attn
        rows = attention.rows
        hidden = layer.input_layernorm(x)  # [1, q, hidden]
        shape = (1, x.shape[1], -1, attn.head_dim)
        fused = getattr(attn, "qkv_int4", None)  # 4-bit q/k/v in one product (backends/cpu/int4.py)
        if fused is not None:
            projected = rows(fused, hidden).split(fused.splits, dim=-1)
        else:
            projected = (rows(attn.q_proj, hidden), rows(attn.k_proj, hidden), rows(attn.v_proj, hidden))
        query, key, value = (part.reshape(shape).transpose(1, 2) for part in projected)  # [1, heads, q, d]
        raw_query = query
        query, key = apply_rotary_pos_emb(query, key, *rotary)
        if capture is not None:
            capture.queries[attn.layer_idx] = query[0, :, capture.row]  # [heads, d]
        stored = cache.stored
        # [1, kv_heads, stored + q, d]: widened to the model's dtype, or as stored for a kernel that reads them so
        keys, values = cache.update_stored(key, value) if attention.reads_storage else cache.update(key, value)
        tiles = cache.tiles() if attention.reads_storage else None
        out = attention.attend(raw_query, query, keys, values, stored=stored, scaling=attn.scaling, tiles=tiles)
        x = x + rows(attn.o_proj, out)
        mlp, hidden = layer.mlp, layer.post_attention_layernorm(x)
        fused = getattr(mlp, "gate_up_int4", None)
        if fused is None:
            return x + rows(mlp, hidden)
        gate, up = rows(fused, hidden).split(fused.splits, dim=-1)  # the family's MLP, gate and up in one
        return x + rows(mlp.down_proj, mlp.act_fn(gate) * up)
