"""The lean backend on a CPU where rounding would part a verified tree from plain decoding.

That is a model computing in bfloat16/float16, or with 4-bit layers, which round their inputs to
bfloat16: float32 noise of ~1e-7 near a rounding edge becomes a 2^-9 step. There, an exact forward
(verification; plain decoding is verification of the root alone) gives each token the bits it gets
alone: batch-invariant attention (`exact_attention.py`, `exact_float32.py`, or the C++ row kernel)
and linear layers by the row-exact dense products (`dense.py`), one order per output on every CPU.
With 4-bit weights, the C++ decoder runs every layer in one call and a Q8_0 head reads int8
(`native_decoder.py`, `q8_head.py`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import torch
from transformers import PreTrainedModel

from tokenswift_cli.backends.cpu import dense, kernels
from tokenswift_cli.backends.cpu import row_attention as row_kernel
from tokenswift_cli.backends.cpu.blocks import BlockLinear
from tokenswift_cli.backends.cpu.exact_attention import exact_attention
from tokenswift_cli.backends.cpu.exact_float32 import Float32Layout, exact_attention_float32
from tokenswift_cli.backends.cpu.int4 import Int4Linear
from tokenswift_cli.backends.cpu.native_decoder import NativeDecoder
from tokenswift_cli.backends.cpu.q8_head import Q8Head
from tokenswift_cli.backends.cpu.row_attention import RowLayout, row_attention
from tokenswift_cli.backends.lean import Attention, FastAttention, LeanBackend, Rotation
from tokenswift_cli.model.cache import FullCache, Tiles, _PreallocatedCache
from tokenswift_cli.model.forward import Forward, QueryCapture


def rounds_inputs(model: PreTrainedModel) -> bool:
    """Whether the model has quantised layers (4-bit, or a GGUF file's blocks: they quantise their inputs)."""
    return any(isinstance(module, Int4Linear | BlockLinear) for module in model.modules())


def q8_head_for(model: PreTrainedModel) -> Q8Head | None:
    """With 4-bit weights (the engine's own model), the output head as the embedded GGUF's Q8_0, if it is one."""
    head = model.get_output_embeddings()
    if not rounds_inputs(model) or not kernels.available() or isinstance(head, BlockLinear):
        return None
    return Q8Head.from_weight(head.weight)


@dataclass(frozen=True)
class ExactAttention:
    """Batch-invariant attention in bfloat16/float16 (`exact_attention.py`), linear layers row-exact."""

    fast: FastAttention  # this forward's positions, window and sink rotation
    reads_storage: ClassVar[bool] = False

    def rows(self, module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        return dense.apply(module, x)

    def to(self, device: torch.device) -> ExactAttention:
        return dataclasses.replace(self, fast=self.fast.to(device))

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
        fast, window = self.fast, self.fast.window
        sinks = {"first_recent": fast.first_recent, "sinks": window.sinks, "window": window.size} if window else {}
        return exact_attention(
            query, keys, values, positions=fast.positions, committed=fast.committed, block_mask=fast.block_mask,
            scaling=scaling, sink_query=fast.sink_query(raw_query), **sinks,
        )  # fmt: skip


@dataclass(frozen=True)
class Float32Attention(ExactAttention):
    """Batch-invariant float32 attention in torch, its layout worked out once for all layers."""

    layout: Float32Layout

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
        sink_query = self.fast.sink_query(raw_query)
        return exact_attention_float32(query, keys, values, self.layout, scaling=scaling, sink_query=sink_query)


@dataclass(frozen=True)
class RowKernelAttention(ExactAttention):
    """Batch-invariant float32 attention by the C++ row kernel, its layout worked out once for all layers."""

    layout: RowLayout
    reads_storage: ClassVar[bool] = True  # float16 widened as read; 8-bit rows by integer products

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
        sink_query = self.fast.sink_query(raw_query)
        return row_attention(query, keys, values, self.layout, scaling=scaling, sink_query=sink_query, tiles=tiles)


class BatchInvariantBackend(LeanBackend):
    """The lean forward, exact where asked, with the row kernel, native decoder and Q8 head where they apply.

    For CPU models computing in reduced precision or with 4-bit layers (`select.backend_for`).
    """

    def __init__(self, model: PreTrainedModel) -> None:
        super().__init__(model)
        config = model.config
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.rounds_inputs = rounds_inputs(model)
        # exact float32 attention by the C++ kernel where it applies (compiled on first use), else torch
        self.row_kernel = self.dtype == torch.float32 and row_kernel.supports(head_dim) and row_kernel.available()
        self.q8_head = q8_head_for(model)
        # ... and every layer in one C++ call where the row kernel runs (same bits, no per-op overhead)
        self.native = NativeDecoder.of(model) if self.row_kernel and self.rounds_inputs else None
        self.group: int = config.num_attention_heads // (config.num_key_value_heads or config.num_attention_heads)

    def attention(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        cache: _PreallocatedCache,
        *,
        block_mask: torch.Tensor | None,
        exact: bool,
    ) -> Attention:
        """Exact attention where asked (once the window's sinks are cached), else the fast kernels."""
        window = cache.window if isinstance(cache, FullCache) else None
        # One token over a cache stored narrower (the draft pass under a window): the native decoder
        # reads it as stored, where the fast path would widen a copy of all of it.
        narrow = cache.storage_dtype not in (None, self.dtype)
        exact = exact or (narrow and x.shape[1] == 1 and self.native is not None)
        # exact attention reads the sinks from the cache: until all are there (a first prefill chunk), the fast path
        exact = exact and (window is None or cache.length >= window.sinks)
        fast = self.fast_attention(x, positions, cache, block_mask, rotate_sinks=exact)
        if not exact:
            return fast
        if self.dtype != torch.float32:
            return ExactAttention(fast)
        sinks = {"window": window.size, "sinks": window.sinks} if window else {}
        if self.row_kernel:
            layout = RowLayout.build(positions[0], cache.length, block_mask, first_recent=fast.first_recent, **sinks)
            return RowKernelAttention(fast, layout)
        float32_layout = Float32Layout.build(
            positions[0], cache.length, block_mask, group=self.group, first_recent=fast.first_recent, **sinks
        )
        return Float32Attention(fast, float32_layout)

    def layers(
        self,
        x: torch.Tensor,
        rotary: Rotation,
        cache: _PreallocatedCache,
        attention: Attention,
        capture: QueryCapture | None,
    ) -> Forward:
        """Every layer in one C++ call where the row kernel attends, else layer by layer in Python."""
        if self.native is None or not isinstance(attention, RowKernelAttention):
            return super().layers(x, rotary, cache, attention, capture)
        row = None if capture is None else capture.row
        sink_rotation = attention.fast.sink_rotation
        x, queries = self.native.forward(x, rotary, sink_rotation, cache.layer_list, attention.layout, row)
        if capture is not None and queries is not None:
            capture.queries.update(enumerate(queries))
        return Forward(pre_norm=x[0], hidden=self.decoder.norm(x)[0])
