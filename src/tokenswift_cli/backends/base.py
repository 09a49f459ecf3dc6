"""The backend seam: how a forward of the target model runs on its device, decided once at load time.

`select.backend_for` picks one backend per model; `model.target.Target` only delegates to it. A
backend runs new tokens after a cache's committed positions and turns hidden states into logits;
its plain attributes say what the engine (and the tests) may rely on.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Protocol

import torch
from transformers import PreTrainedModel

from tokenswift_cli.backends.cpu import blocks, dense
from tokenswift_cli.backends.placement import execution_device
from tokenswift_cli.model.cache import _PreallocatedCache
from tokenswift_cli.model.forward import Forward, QueryCapture


class OutputHead(Protocol):
    """An output head stored otherwise than the lm_head's weight; each row's logits depend on that row only."""

    def kernel_attends(self, rows: int, *, exact: bool = True) -> bool:
        """Whether a forward attending `rows` rows attends through the Triton kernels (`cuda/attention_kernel.py`)."""
        return False

    def logits(self, hidden: torch.Tensor) -> torch.Tensor: ...


class Backend(ABC):
    """How one model's forwards run. Subclasses set the attributes that apply to them."""

    lean = False  # runs the decoder's layers itself: context windows (and automatic rope scaling) need it
    native: Any = None  # a compiled decoder that reads a float16 cache in place (so "auto" stores float16)
    row_kernel = False  # exact float32 attention through the C++ row kernel
    rounds_inputs = False  # 4-bit layers round their inputs to bfloat16 (so float32 verification runs exactly)
    q8_head: OutputHead | None = None  # the output head as Q8_0, read as int8
    kernel_attention = False  # exact attention through the Triton kernels (`cuda/attention_kernel.py`)
    dot_attention = False  # ... and forwards of many rows too, on float64 tensor cores
    fused_layers = False  # exact forwards' norms, rotation and activation fused (`cuda/layer_kernels.py`)

    def __init__(self, model: PreTrainedModel) -> None:
        self.model = model
        self.decoder: Any = model.get_decoder()
        self.lm_head: Any = model.get_output_embeddings()
        self.device: torch.device = execution_device(self.decoder.embed_tokens)
        self.dtype: torch.dtype = blocks.compute_dtype(self.decoder.embed_tokens)
        # Under `--device auto` the layers may compute on several devices (`placement.py`): each layer's
        # keys/values live on its own, and the final norm's device is where the hidden states end up.
        self.layer_devices = [execution_device(layer) for layer in self.decoder.layers]
        self.output_device = execution_device(self.decoder.norm)
        self.head_device = execution_device(self.lm_head)

    @abstractmethod
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
        """Run `tokens` `[q]` at `positions` `[1, q]` (both on the device) after `cache`'s committed positions.

        Each token sees every committed position and the new tokens `block_mask` `[q, q]` allows
        (None: causal); the new keys/values are written after the committed ones. `exact`: the
        caller needs each token's result independent of the rest of the batch, where the backend
        can tell them apart (verification against plain decoding).
        """

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Next-token logits `[..., vocab]` in float32 from post-norm hidden states `[..., hidden]`."""
        if self.q8_head is not None:
            return self.q8_head.logits(hidden)
        rows = hidden.to(self.head_device).reshape(-1, hidden.shape[-1])
        # a row's bits whatever the batch (on a CPU; CUDA's exact backend pads to one row count instead)
        logits = (dense.apply(self.lm_head, rows) if rows.device.type == "cpu" else self.lm_head(rows)).float()
        return logits.reshape(*hidden.shape[:-1], -1)
