"""Draft heads (TokenSwift step 1): K residual blocks chained on the model's pre-norm hidden state.

Head i maps `h_i` to `h_{i+1} = h_i + W_i · input_norm_i(h_i)`; its logits are
`lm_head(post_norm_i(h_{i+1}))` and predict the token i+2 positions after the hidden state's own.
The state-dict layout `medusa_layers.{i}.linear / input_layernorm / post_layernorm` is the one of
the published TokenSwift adapters, so those load as they are.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
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


class HeadsError(Exception):
    """Heads cannot be used with this model; the message is one line meant for the user."""


HEADS_PREFIX = "medusa_layers."


def save_heads(heads: DraftHeads, path: Path, metadata: dict[str, str]) -> None:
    """Write heads as safetensors (`medusa_layers.*`) with string metadata, atomically."""
    tensors = {k: v.detach().float().contiguous().cpu() for k, v in heads.state_dict().items()}
    meta = {"num_heads": str(heads.num_heads), "hidden_size": str(heads.hidden_size), **metadata}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    save_file(tensors, str(tmp), metadata=meta)
    os.replace(tmp, path)


def read_metadata(path: Path) -> dict[str, str]:
    with safe_open(str(path), framework="pt") as handle:
        return dict(handle.metadata() or {})


def load_heads(path: Path, config: object, *, fingerprint: str | None = None) -> DraftHeads:
    """Load heads for a model config; refuse heads trained for another model (hidden size, fingerprint)."""
    if not path.is_file():
        raise HeadsError(f"heads file not found: {path}")
    try:
        state = load_file(str(path))
        metadata = read_metadata(path)
    except Exception as error:  # safetensors raises several types for a damaged file
        raise HeadsError(f"cannot read heads file {path}: {error}") from None
    state = {k[k.index(HEADS_PREFIX) :]: v for k, v in state.items() if HEADS_PREFIX in k}
    indices = {int(k.split(".")[1]) for k in state}
    if not indices:
        raise HeadsError(f"{path} holds no draft heads (no medusa_layers.* tensors)")
    hidden = int(config.hidden_size)  # type: ignore[attr-defined]
    width = state[f"{HEADS_PREFIX}0.linear.weight"].shape[-1]
    if width != hidden:
        raise HeadsError(f"heads in {path} are for hidden size {width}, the model has {hidden}")
    expected = metadata.get("base_model_fingerprint")
    if fingerprint is not None and expected is not None and expected != fingerprint:
        raise HeadsError(f"heads in {path} were trained for another model (fingerprint {expected[:12]})")
    heads = DraftHeads(hidden, len(indices), float(getattr(config, "rms_norm_eps", 1e-5)))
    try:
        heads.load_state_dict(state)
    except RuntimeError as error:
        raise HeadsError(f"heads in {path} do not match the expected layout: {error}") from None
    return heads.eval().requires_grad_(False)
