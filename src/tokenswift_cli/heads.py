"""Draft heads (TokenSwift step 1): K residual blocks chained on the model's pre-norm hidden state.

Head i maps `h_i` to `h_{i+1} = h_i + W_i · input_norm_i(h_i)`; its logits are
`lm_head(post_norm_i(h_{i+1}))` and predict the token i+2 positions after the hidden state's own.
The state-dict layout `medusa_layers.{i}.linear / input_layernorm / post_layernorm` is the one of
the published TokenSwift adapters, so those load as they are.
"""

from __future__ import annotations

import torch
from torch import nn


class HeadBlock(nn.Module):
    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.input_layernorm = nn.RMSNorm(hidden_size, eps=eps)
        self.linear = nn.Linear(hidden_size, hidden_size, bias=False)
        self.post_layernorm = nn.RMSNorm(hidden_size, eps=eps)

    def forward(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (next residual state, normalised state for the lm_head)."""
        nxt = hidden + self.linear(self.input_layernorm(hidden))
        return nxt, self.post_layernorm(nxt)


class DraftHeads(nn.Module):
    """K chained heads; `forward` gives the K normalised states to send through the lm_head."""

    def __init__(self, hidden_size: int, num_heads: int = 3, eps: float = 1e-5) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.medusa_layers = nn.ModuleList(HeadBlock(hidden_size, eps) for _ in range(num_heads))

    @property
    def num_heads(self) -> int:
        return len(self.medusa_layers)

    def forward(self, pre_norm: torch.Tensor) -> torch.Tensor:
        """pre_norm `[..., hidden]` -> normalised head states `[..., K, hidden]`."""
        states = []
        hidden = pre_norm
        for block in self.medusa_layers:
            hidden, normed = block(hidden)
            states.append(normed)
        return torch.stack(states, dim=-2)

    @classmethod
    def for_model(cls, config: object, num_heads: int = 3) -> DraftHeads:
        """Heads sized for a model config, initialised to the identity residual (W = 0)."""
        hidden = int(config.hidden_size)  # type: ignore[attr-defined]
        eps = float(getattr(config, "rms_norm_eps", 1e-5))
        heads = cls(hidden, num_heads, eps)
        for block in heads.medusa_layers:
            nn.init.zeros_(block.linear.weight)  # type: ignore[union-attr]
        return heads
