"""Draft heads (TokenSwift step 1): K residual blocks on the model's pre-norm hidden state.

Chained (the reference): head i maps `h_i` to `h_{i+1} = h_i + W_i · input_norm_i(h_i)`, `h_0` the
model's state. Parallel (Medusa's): every head reads `h_0`, `h'_i = h_0 + W_i · input_norm_i(h_0)`.
Head i's logits are `lm_head(post_norm_i(...))` and predict the token i+2 positions after the
hidden state's own. The state-dict layout `medusa_layers.{i}.linear / input_layernorm /
post_layernorm` is the one of the published TokenSwift adapters, so those load as they are; the
metadata key `chained` ("false") marks parallel heads.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, cast

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import nn

from tokenswift_cli.data import HEADS
from tokenswift_cli.paths import home_dir

if TYPE_CHECKING:
    from tokenswift_cli.model.loading import LoadedModel


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
    """K heads, chained or parallel; `forward` gives the K normalised states to send through the lm_head."""

    def __init__(self, hidden_size: int, num_heads: int = 3, eps: float = 1e-5, *, chained: bool = True) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.chained = chained
        self.medusa_layers = nn.ModuleList(HeadBlock(hidden_size, eps) for _ in range(num_heads))

    @property
    def blocks(self) -> list[HeadBlock]:
        return [cast(HeadBlock, block) for block in self.medusa_layers]

    @property
    def num_heads(self) -> int:
        return len(self.medusa_layers)

    def forward(self, pre_norm: torch.Tensor) -> torch.Tensor:
        """pre_norm `[..., hidden]` -> normalised head states `[..., K, hidden]`."""
        states = []
        hidden = pre_norm
        for block in self.medusa_layers:
            nxt, normed = block(hidden)
            hidden = nxt if self.chained else pre_norm
            states.append(normed)
        return torch.stack(states, dim=-2)

    @classmethod
    def for_model(
        cls, config: object, num_heads: int = 3, *, norm_weight: torch.Tensor | None = None, chained: bool = True
    ) -> DraftHeads:
        """Heads sized for a model config, initialised to the identity residual (W = 0).

        With `norm_weight` (the model's final norm), every head starts out predicting exactly what
        the base model predicts next, a better start than a random one.
        """
        hidden = int(config.hidden_size)  # type: ignore[attr-defined]
        eps = float(getattr(config, "rms_norm_eps", 1e-5))
        heads = cls(hidden, num_heads, eps, chained=chained)
        for block in heads.blocks:
            nn.init.zeros_(block.linear.weight)
            if norm_weight is not None:
                block.post_layernorm.weight.data.copy_(norm_weight.detach().float())
        return heads


class HeadsError(Exception):
    """Heads cannot be used with this model; the message is one line meant for the user."""


HEADS_PREFIX = "medusa_layers."


def save_heads(heads: DraftHeads, path: Path, metadata: dict[str, str]) -> None:
    """Write heads as safetensors (`medusa_layers.*`) with string metadata, atomically."""
    tensors = {k: v.detach().float().contiguous().cpu() for k, v in heads.state_dict().items()}
    meta = {"num_heads": str(heads.num_heads), "hidden_size": str(heads.hidden_size),
            "chained": str(heads.chained).lower(), **metadata}  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    save_file(tensors, str(tmp), metadata=meta)
    os.replace(tmp, path)


def read_metadata(path: Path) -> dict[str, str]:
    with safe_open(str(path), framework="pt") as handle:
        return dict(handle.metadata() or {})


def load_heads(
    path: Path, config: object, *, fingerprint: str | None = None, gguf_sha256: str | None = None
) -> DraftHeads:
    """Load heads for a model config; refuse heads trained for another model (hidden size, identity).

    The model's identity is its GGUF file's sha256 when both sides know it (a converted copy's
    fingerprint may change with the converter), else its fingerprint.
    """
    if not path.is_file():
        raise HeadsError(f"heads file not found: {path}")
    try:
        state = load_file(str(path))
        metadata = read_metadata(path)
    except Exception as error:  # safetensors raises several types for a damaged file
        raise HeadsError(f"cannot read heads file {path}: {error}") from None
    _check_identity(path, metadata, fingerprint, gguf_sha256)
    return heads_from_state(state, config, origin=str(path), chained=metadata.get("chained", "true") != "false")


def _check_identity(path: Path, metadata: dict[str, str], fingerprint: str | None, gguf: str | None) -> None:
    expected_gguf = metadata.get("base_model_gguf_sha256")
    if gguf is not None and expected_gguf:
        if expected_gguf != gguf:
            raise HeadsError(f"heads in {path} were trained for another model (GGUF sha256 {expected_gguf[:12]})")
        return
    expected = metadata.get("base_model_fingerprint")
    if fingerprint is not None and expected and expected != fingerprint:
        raise HeadsError(f"heads in {path} were trained for another model (fingerprint {expected[:12]})")


def heads_from_state(
    state: dict[str, torch.Tensor], config: object, *, origin: str = "checkpoint", chained: bool = True
) -> DraftHeads:
    """Build heads from any state dict holding `...medusa_layers.{i}.*` (a prefix such as `model.` is dropped)."""
    state = {k[k.index(HEADS_PREFIX) :]: v.float() for k, v in state.items() if HEADS_PREFIX in k}
    indices = {int(k.split(".")[1]) for k in state}
    if not indices:
        raise HeadsError(f"{origin} holds no draft heads (no medusa_layers.* tensors)")
    if indices != set(range(len(indices))):
        raise HeadsError(f"{origin} has draft heads {sorted(indices)}: they must be numbered from 0 without gaps")
    hidden = int(config.hidden_size)  # type: ignore[attr-defined]
    key = f"{HEADS_PREFIX}0.linear.weight"
    width = state[key].shape[-1] if key in state else None
    if width != hidden:
        raise HeadsError(f"heads in {origin} are for hidden size {width}, the model has {hidden}")
    heads = DraftHeads(hidden, len(indices), float(getattr(config, "rms_norm_eps", 1e-5)), chained=chained)
    try:
        heads.load_state_dict(state)
    except RuntimeError as error:
        raise HeadsError(f"heads in {origin} do not match the expected layout: {error}") from None
    return heads.eval().requires_grad_(False)


def read_checkpoint_heads(source: Path) -> dict[str, torch.Tensor]:
    """The `medusa_layers.*` tensors of a TokenSwift model checkpoint (a file, or a folder of shards).

    TokenSwift stores its heads inside the model's own state dict (`model.medusa_layers.{i}.*`);
    only those tensors are read, so a multi-GB checkpoint costs little.
    """
    if source.is_dir():
        files = sorted(p for p in source.iterdir() if p.suffix in (".safetensors", ".bin", ".pt", ".pth"))
    elif source.is_file():
        files = [source]
    else:
        raise HeadsError(f"no such checkpoint file or folder: {source}")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            if file.suffix == ".safetensors":
                with safe_open(str(file), framework="pt") as handle:
                    state |= {k: handle.get_tensor(k) for k in handle.keys() if HEADS_PREFIX in k}  # noqa: SIM118
            else:
                loaded = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
                state |= {k: v for k, v in loaded.items() if HEADS_PREFIX in k}
        except Exception as error:  # damaged or foreign file: one clear line for the user
            raise HeadsError(f"cannot read checkpoint {file}: {error}") from None
    return state


def import_heads(source: Path, config: object | None = None) -> DraftHeads:
    """Heads from a TokenSwift model checkpoint, checked against `config` (else sized from the tensors)."""
    state = read_checkpoint_heads(source)
    if config is None:
        width = next((v.shape[-1] for k, v in state.items() if k.endswith("0.linear.weight")), 0)
        config = SimpleNamespace(hidden_size=width, rms_norm_eps=_checkpoint_eps(source))
    return heads_from_state(state, config, origin=str(source))


def _checkpoint_eps(source: Path) -> float:
    config = (source if source.is_dir() else source.parent) / "config.json"
    try:
        return float(json.loads(config.read_text(encoding="utf-8")).get("rms_norm_eps", 1e-5))
    except (OSError, ValueError):
        return 1e-5


SHIPPED = {"default": "smollm2-135m-instruct.safetensors"}


def shipped_heads(model_name: str) -> Path | None:
    """The trained heads of a model, if any: in $TOKENSWIFT_HOME/heads, else the package's own."""
    name = SHIPPED.get(model_name)
    if name is None:
        return None
    for folder in (home_dir() / "heads", HEADS):
        if (folder / name).is_file():
            return folder / name
    return None


def model_identity(fingerprint: str, source: str = "") -> dict[str, str]:
    """Metadata naming the base model: its fingerprint and, for a converted GGUF file, the file's sha256."""
    identity = {"base_model_fingerprint": fingerprint}
    record = Path(source) / "tokenswift-source.json" if source else None
    if record is not None and record.is_file():
        sha = json.loads(record.read_text(encoding="utf-8")).get("gguf_sha256")
        if sha:
            identity["base_model_gguf_sha256"] = str(sha)
    return identity


def resolve_heads(choice: str, loaded: LoadedModel) -> tuple[DraftHeads | None, Path | None]:
    """`--heads`: "none", "default" (the shipped heads of the model, none if there are none) or a file.

    Returns the heads and the file they came from; refuses heads of another model (HeadsError).
    """
    if choice == "none":
        return None, None
    path = shipped_heads(loaded.name) if choice == "default" else Path(choice).expanduser()
    if path is None:
        return None, None
    identity = model_identity(loaded.fingerprint, loaded.source)
    heads = load_heads(
        path,
        loaded.model.config,
        fingerprint=loaded.fingerprint,
        gguf_sha256=identity.get("base_model_gguf_sha256"),
    )
    return heads, path
