"""The stock backend: the `transformers` decoder, driven through public extension points only.

A custom attention function registered under `ATTENTION_NAME` (packed GQA, an explicit bool mask),
a custom `Cache`, `position_ids`, and a forward pre-hook on the final norm for the pre-norm hidden
state that the draft heads read. Any device, any family `transformers` runs.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from transformers import AttentionInterface, PreTrainedModel
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from tokenswift_cli.backends.base import Backend, OutputHead
from tokenswift_cli.model.cache import _PreallocatedCache
from tokenswift_cli.model.forward import Forward, QueryCapture

ATTENTION_NAME = "tokenswift"


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


class StockBackend(Backend):
    """The `transformers` decoder with the registered attention; `q8_head` replaces the lm_head if given."""

    def __init__(self, model: PreTrainedModel, *, q8_head: OutputHead | None = None) -> None:
        super().__init__(model)
        self.q8_head = q8_head
        self._pre_norm: torch.Tensor | None = None
        self.decoder.norm.register_forward_pre_hook(self._keep_pre_norm)

    def _keep_pre_norm(self, module: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> None:
        self._pre_norm = args[0]

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
        """One decoder call over a `[1, 1, q, L + q]` bool mask; `exact` is not honoured (no layer loop here)."""
        q_len = tokens.shape[0]
        mask = None
        if q_len > 1:
            if block_mask is None:
                block_mask = torch.ones(q_len, q_len, dtype=torch.bool).tril()
            visible = torch.ones(q_len, cache.length, dtype=torch.bool)
            mask = torch.cat([visible, block_mask.cpu()], dim=1)[None, None].to(self.device)  # [1, 1, q, L + q]
        out = self.decoder(
            input_ids=tokens[None],
            position_ids=positions,
            attention_mask=mask,
            past_key_values=cache,
            use_cache=True,
            query_capture=capture,
        )
        assert self._pre_norm is not None
        pre_norm, self._pre_norm = self._pre_norm[0], None
        return Forward(pre_norm=pre_norm, hidden=out.last_hidden_state[0])
