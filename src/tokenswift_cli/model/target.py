"""The target model: the only code that knows how a `transformers` causal LM is driven.

Two paths compute the same forward. The lean path (default where the layout is known: llama,
qwen2, mistral without sliding windows) calls the model's own modules layer by layer, gpt-fast
style, with the attention fast path of `attention.py`; it skips the framework's mask building and
cache bookkeeping, which cost more than the weights at short context on a CPU. The stock path calls
the `transformers` decoder with public extension points only: a custom attention function registered
under `ATTENTION_NAME` (packed GQA, an explicit bool mask), a custom `Cache`, `position_ids`, and a
forward pre-hook on the final norm for the pre-norm hidden state that the draft heads read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from transformers import AttentionInterface, PreTrainedModel
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb, rotate_half

from tokenswift_cli.backends.cpu import row_attention as row_kernel
from tokenswift_cli.backends.cpu.exact_attention import exact_attention, exact_rows
from tokenswift_cli.backends.cpu.exact_float32 import Float32Layout, exact_attention_float32
from tokenswift_cli.backends.cpu.int4 import Int4Linear
from tokenswift_cli.backends.cpu.native_decoder import NativeDecoder
from tokenswift_cli.backends.cpu.q8_head import Q8Head
from tokenswift_cli.backends.cpu.row_attention import RowLayout, row_attention
from tokenswift_cli.config import ContextWindow
from tokenswift_cli.model.attention import attend, window_attention
from tokenswift_cli.model.cache import FullCache, PreallocatedLayer, _PreallocatedCache

ATTENTION_NAME = "tokenswift"


class QueryCapture:
    """Collects, per layer, the (rotated) query of one row of a forward: it scores keys for the partial cache."""

    def __init__(self, row: int) -> None:
        self.row = row
        self.queries: dict[int, torch.Tensor] = {}

    def ordered(self) -> list[torch.Tensor]:
        return [self.queries[i] for i in sorted(self.queries)]


def tokenswift_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Scaled dot-product attention with the query heads of a KV group packed as extra rows.

    query `[b, heads, q, d]`, key/value `[b, kv_heads, L, d]`, mask `[b|1, 1, q, L]` bool or None.
    Packing avoids materialising the key/value heads `heads / kv_heads` times.
    """
    capture: QueryCapture | None = kwargs.get("query_capture")
    if capture is not None:
        capture.queries[module.layer_idx] = query[0, :, capture.row].detach()  # type: ignore[index]
    batch, heads, q_len, dim = query.shape
    kv_heads = key.shape[1]
    group = heads // kv_heads
    packed = query.reshape(batch, kv_heads, group * q_len, dim)  # heads of group j are rows j*g .. j*g+g-1
    mask = attention_mask
    if mask is None and q_len > 1:  # no mask given: causal, aligned to the last key
        keys = key.shape[-2]
        mask = torch.ones(q_len, keys, dtype=torch.bool, device=query.device).tril(keys - q_len)[None, None]
    if mask is not None:
        if mask.dtype != torch.bool:
            raise TypeError("the tokenswift attention expects a boolean mask (True = attend)")
        mask = mask[:, :, None].expand(-1, -1, group, -1, -1).reshape(mask.shape[0], 1, group * q_len, -1)
    out = F.scaled_dot_product_attention(packed, key, value, attn_mask=mask, scale=scaling)
    # out: [b, kv_heads, group * q, d]
    return out.reshape(batch, heads, q_len, dim).transpose(1, 2), None


AttentionInterface.register(ATTENTION_NAME, tokenswift_attention)
AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)


@dataclass(frozen=True)
class Forward:
    """Hidden states of one forward: `pre_norm` feeds the heads, `hidden` (post-norm) the lm_head."""

    pre_norm: torch.Tensor  # [q, hidden]
    hidden: torch.Tensor  # [q, hidden]


LEAN_FAMILIES = ("llama", "qwen2", "mistral")


def supports_lean(model: PreTrainedModel) -> bool:
    """The lean forward knows this layout: a supported family, full attention in every layer."""
    config = model.config
    sliding = getattr(config, "sliding_window", None) if getattr(config, "use_sliding_window", True) else None
    layer_types = set(getattr(config, "layer_types", None) or ["full_attention"])
    return config.model_type in LEAN_FAMILIES and sliding is None and layer_types == {"full_attention"}


class Target:
    """Wraps a stock `transformers` causal LM for cached, masked, positioned forwards.

    `lean` None picks the lean forward when the model supports it; False forces the stock decoder.
    """

    def __init__(self, model: PreTrainedModel, *, lean: bool | None = None) -> None:
        model.set_attn_implementation(ATTENTION_NAME)
        self.model = model
        self.decoder = model.get_decoder()
        self.lm_head = model.get_output_embeddings()
        self.num_layers: int = model.config.num_hidden_layers
        self.device = self.decoder.embed_tokens.weight.device
        self.dtype = self.decoder.embed_tokens.weight.dtype
        self.lean = supports_lean(model) if lean is None else lean
        # 4-bit layers round their inputs to bfloat16: float32 noise of ~1e-7 near a rounding edge
        # becomes a 2^-9 step, so float32 attention must be batch-invariant too (exact mode).
        self.rounds_inputs = any(isinstance(m, Int4Linear) for m in model.modules())
        config = model.config
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        # Exact float32 attention by the C++ kernel where it applies (compiled on first use), else torch.
        self.row_kernel = self.device.type == "cpu" and row_kernel.supports(head_dim)
        # With 4-bit weights (the engine's own model), a Q8_0 head (the embedded GGUF's) reads int8.
        self.q8_head = Q8Head.from_weight(self.lm_head.weight) if self.rounds_inputs else None
        # ... and every layer in one C++ call where the row kernel runs (same bits, no per-op overhead).
        usable = self.row_kernel and self.lean and self.rounds_inputs and self.dtype == torch.float32
        self.native = NativeDecoder.of(model) if usable else None
        self._pre_norm: torch.Tensor | None = None
        self.decoder.norm.register_forward_pre_hook(self._keep_pre_norm)

    def _keep_pre_norm(self, module: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> None:
        self._pre_norm = args[0]

    @torch.no_grad()
    def forward(
        self,
        tokens: torch.Tensor,
        cache: _PreallocatedCache,
        *,
        depths: torch.Tensor | None = None,
        block_mask: torch.Tensor | None = None,
        capture: QueryCapture | None = None,
        start: int | None = None,
        exact: bool = False,
    ) -> Forward:
        """Run `tokens` `[q]` after the committed positions of `cache`.

        Token i sits at position `start + depths[i]` (default: consecutive after `cache.length`; the
        partial cache holds fewer positions than the text it drafts for) and sees every
        committed position plus the new tokens allowed by `block_mask` `[q, q]` (default: causal).
        The new keys/values are written after the committed ones; `cache.length` does not move.
        `exact`: in bfloat16/float16, or with 4-bit weights, each token's result does not depend on the
        others in the batch (`exact_attention.py`), so a verified tree and plain decoding agree bit for bit.
        """
        q_len = tokens.shape[0]
        start = cache.length if start is None else start
        if depths is None:
            depths = torch.arange(q_len)
        positions = (depths + start).to(self.device)[None]  # [1, q]
        if self.lean:
            return self._lean_forward(tokens.to(self.device), positions, cache, block_mask, capture, exact)
        mask = None
        if q_len > 1:
            if block_mask is None:
                block_mask = torch.ones(q_len, q_len, dtype=torch.bool).tril()
            visible = torch.ones(q_len, cache.length, dtype=torch.bool)
            mask = torch.cat([visible, block_mask.cpu()], dim=1)[None, None].to(self.device)  # [1, 1, q, L + q]
        out = self.decoder(
            input_ids=tokens.to(self.device)[None],
            position_ids=positions,
            attention_mask=mask,
            past_key_values=cache,
            use_cache=True,
            query_capture=capture,
        )
        assert self._pre_norm is not None
        pre_norm, self._pre_norm = self._pre_norm[0], None
        return Forward(pre_norm=pre_norm, hidden=out.last_hidden_state[0])

    def _lean_forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        cache: _PreallocatedCache,
        block_mask: torch.Tensor | None,
        capture: QueryCapture | None,
        exact: bool,
    ) -> Forward:
        """The decoder's computation through its own modules, without masks or cache bookkeeping."""
        x = self.decoder.embed_tokens(tokens[None])  # [1, q, hidden]
        cos, sin = self.decoder.rotary_emb(x, positions)
        window = cache.window if isinstance(cache, FullCache) else None
        first_recent = cache.first_recent if isinstance(cache, FullCache) else 0
        # One token over a cache stored narrower (the draft pass under a window): the native decoder
        # reads it as stored, where the fast path would widen a copy of all of it.
        narrow = cache.storage_dtype not in (None, self.dtype)
        exact = exact or (narrow and tokens.shape[0] == 1 and self.native is not None)
        # Measured invariant on CPUs only (oneDNN); elsewhere reduced precision keeps the fast kernels.
        exact = exact and (self.dtype != torch.float32 or self.rounds_inputs) and self.device.type == "cpu"
        exact = exact and (window is None or cache.length >= window.sinks)
        sink_rotation = None
        if window is not None and (exact or int(positions.max()) >= window.span):
            sink_cos, sink_sin = self.decoder.rotary_emb(x, positions.clamp(max=window.span - 1))
            sink_rotation = (sink_cos[:, None], sink_sin[:, None])
        layout: Float32Layout | RowLayout | None = None
        if exact and self.dtype == torch.float32:  # worked out once for all layers
            config = self.model.config
            group = config.num_attention_heads // (config.num_key_value_heads or config.num_attention_heads)
            sinks = {"window": window.size, "sinks": window.sinks} if window else {}
            if self.row_kernel and row_kernel.available():
                layout = RowLayout.build(positions[0], cache.length, block_mask, first_recent=first_recent, **sinks)
            else:
                layout = Float32Layout.build(
                    positions[0], cache.length, block_mask, group=group, first_recent=first_recent, **sinks
                )
        if self.native is not None and isinstance(layout, RowLayout):
            row = None if capture is None else capture.row
            x, queries = self.native.forward(x, (cos, sin), sink_rotation, cache.layer_list, layout, row)
            if capture is not None and queries is not None:
                capture.queries.update(enumerate(queries))
            return Forward(pre_norm=x[0], hidden=self.decoder.norm(x)[0])
        plan = _AttentionPlan(
            positions[0], block_mask, window, cache.length, first_recent, sink_rotation, exact, layout
        )
        for index, layer in enumerate(self.decoder.layers):
            x = self._lean_layer(layer, x, (cos, sin), cache.layer_list[index], plan=plan, capture=capture)
        return Forward(pre_norm=x[0], hidden=self.decoder.norm(x)[0])

    def _lean_layer(
        self,
        layer: torch.nn.Module,
        x: torch.Tensor,
        rotary: tuple[torch.Tensor, torch.Tensor],
        cache: PreallocatedLayer,
        *,
        plan: _AttentionPlan,
        capture: QueryCapture | None,
    ) -> torch.Tensor:
        """One decoder layer (pre-norm attention + MLP), as the family's own `forward` computes it."""
        attn = layer.self_attn
        rows = exact_rows if plan.exact else _whole
        hidden = layer.input_layernorm(x)  # [1, q, hidden]
        shape = (1, x.shape[1], -1, attn.head_dim)
        fused = getattr(attn, "qkv_int4", None)  # 4-bit q/k/v in one product (int4.py)
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
        keys, values = cache.update(key, value)  # [1, kv_heads, stored + q, d]
        out = plan.attend(raw_query, query, keys, values, stored=stored, scaling=attn.scaling)
        x = x + rows(attn.o_proj, out)
        mlp, hidden = layer.mlp, layer.post_attention_layernorm(x)
        fused = getattr(mlp, "gate_up_int4", None)
        if fused is None:
            return x + rows(mlp, hidden)
        gate, up = rows(fused, hidden).split(fused.splits, dim=-1)  # the family's MLP, gate and up in one
        return x + rows(mlp.down_proj, mlp.act_fn(gate) * up)

    @torch.no_grad()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Next-token logits `[..., vocab]` in float32 from post-norm hidden states `[..., hidden]`."""
        if self.q8_head is not None and row_kernel.kernels.available():
            return self.q8_head.logits(hidden)
        rows = hidden.to(self.lm_head.weight.device).reshape(-1, hidden.shape[-1])
        logits = exact_rows(self.lm_head, rows, dim=0).float()  # a row's bits, whatever the batch
        return logits.reshape(*hidden.shape[:-1], -1)


def _whole(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    return module(x)


@dataclass(frozen=True)
class _AttentionPlan:
    """How every layer of one forward attends: the fast path, under a context window, or exactly."""

    positions: torch.Tensor  # [q]
    block_mask: torch.Tensor | None
    window: ContextWindow | None
    committed: int  # positions of the text before the new tokens
    first_recent: int  # the first position held after the sinks (see `FullCache.first_recent`)
    sink_rotation: tuple[torch.Tensor, torch.Tensor] | None  # cos/sin at min(position, window span - 1)
    exact: bool
    float32_layout: Float32Layout | RowLayout | None = None  # exact in float32: shared by all layers

    def attend(
        self,
        raw_query: torch.Tensor,
        query: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        *,
        stored: int,
        scaling: float,
    ) -> torch.Tensor:
        window, mask = self.window, self.block_mask
        sink_query = None
        if self.sink_rotation is not None:
            cos, sin = self.sink_rotation
            sink_query = raw_query * cos + rotate_half(raw_query) * sin
        if isinstance(self.float32_layout, RowLayout):
            return row_attention(query, keys, values, self.float32_layout, scaling=scaling, sink_query=sink_query)
        if self.float32_layout is not None:
            return exact_attention_float32(
                query, keys, values, self.float32_layout, scaling=scaling, sink_query=sink_query
            )
        if self.exact:
            sinks = {"first_recent": self.first_recent, "sinks": window.sinks, "window": window.size} if window else {}
            return exact_attention(
                query, keys, values, positions=self.positions, committed=self.committed, block_mask=mask,
                scaling=scaling, sink_query=sink_query, **sinks,
            )  # fmt: skip
        if sink_query is None:
            return attend(query, keys, values, committed=stored, block_mask=mask, scaling=scaling)
        assert window is not None
        return window_attention(
            query, sink_query, keys, values, positions=self.positions, committed=self.committed,
            first_recent=self.first_recent, sinks=window.sinks, size=window.size, block_mask=mask, scaling=scaling,
        )  # fmt: skip
