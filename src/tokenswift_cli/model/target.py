"""The target model: cached, masked, positioned forwards of a `transformers` causal LM.

How a forward runs on the model's device (the stock decoder, the lean layer loop, the CPU's
batch-invariant and native paths) is a backend chosen once at load time (`backends/select.py`);
`Target` works out positions and delegates.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import PreTrainedModel

from tokenswift_cli.backends.select import backend_for
from tokenswift_cli.backends.transfer import to_device
from tokenswift_cli.model.cache import _PreallocatedCache
from tokenswift_cli.model.forward import Forward, QueryCapture


class Target:
    """Wraps a stock `transformers` causal LM for cached, masked, positioned forwards.

    `lean` None picks the lean forward when the model supports it; False forces the stock decoder.
    """

    def __init__(self, model: PreTrainedModel, *, lean: bool | None = None) -> None:
        self.backend = backend_for(model, lean=lean)
        self.model = model
        self.decoder = self.backend.decoder
        self.lm_head = self.backend.lm_head
        self.num_layers: int = model.config.num_hidden_layers
        self.device = self.backend.device
        self.dtype = self.backend.dtype
        self.layer_devices = self.backend.layer_devices  # where each layer's keys/values live
        self.output_device = self.backend.output_device  # where the hidden states (and the draft heads) end up

    # What the backend is and does (see `backends/base.py`), for the engine, tests and benchmarks.
    @property
    def lean(self) -> bool:
        return self.backend.lean

    @property
    def native(self) -> Any:
        return self.backend.native

    @property
    def row_kernel(self) -> bool:
        return self.backend.row_kernel

    @property
    def rounds_inputs(self) -> bool:
        return self.backend.rounds_inputs

    @property
    def q8_head(self) -> Any:
        return self.backend.q8_head

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
        others in the batch (`backends/cpu/exact_attention.py`), so a verified tree and plain decoding
        agree bit for bit.
        """
        start = cache.length if start is None else start
        if depths is None:
            depths = torch.arange(tokens.shape[0])
        positions = to_device(depths + start, self.device)[None]  # [1, q]
        return self.backend.forward(
            to_device(tokens, self.device), positions, cache, block_mask=block_mask, capture=capture, exact=exact
        )

    @torch.no_grad()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Next-token logits `[..., vocab]` in float32 from post-norm hidden states `[..., hidden]`."""
        return self.backend.logits(hidden)
