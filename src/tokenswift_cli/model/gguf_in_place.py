"""A model on a GGUF file's own blocks (`--weights gguf`): the file mapped, nothing converted.

`transformers` builds the model from the file's header (its config, on no memory) and reads the
tokenizer; both are small and kept once under `cache_dir()`, with the file's table of tensors
(`gguf`'s reader parses every metadata field, ~10 s for a 152K vocabulary: once, not per run). The
weights then come from the mapped file tensor by tensor: every quantised linear layer, the output head
included, becomes a `BlockLinear` over the file's bytes; a quantised embedding a `BlockEmbedding`;
the norms and biases (float32 in the file, a few MB) are copied. Llama files store q and k with their
rows permuted for ggml's rotary embedding: those two are put back in transformers' order
(`LlamaTensorProcessor`), which copies them.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from accelerate import init_empty_weights
from accelerate.utils import set_module_tensor_to_device
from gguf import GGMLQuantizationType, GGUFReader
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PretrainedConfig, PreTrainedModel
from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor, TensorProcessor, get_gguf_hf_weights_map

from tokenswift_cli.backends.cpu import blocks
from tokenswift_cli.paths import cache_dir

log = logging.getLogger(__name__)
_DENSE = (GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16)


class InPlaceError(Exception):
    """The file cannot run on its blocks; the message is one line meant for the user."""


@dataclass(frozen=True)
class InPlace:
    """What `build` made: the model, the folder of its config and tokenizer, and what is kept in which form."""

    model: PreTrainedModel
    folder: Path
    kinds: dict[str, int]  # block type name -> tensors read in place
    copied_bytes: int  # norms, biases, permuted q/k: what is not read from the mapping


@dataclass(frozen=True)
class Tensor:
    """One tensor of the file: its type, its numpy shape (rows first) and where its bytes are."""

    kind: GGMLQuantizationType
    shape: tuple[int, ...]
    offset: int
    size: int


def _table(reader: GGUFReader) -> dict[str, dict[str, object]]:
    return {
        t.name: {"kind": int(t.tensor_type), "shape": [int(n) for n in t.data.shape], "offset": int(t.data_offset),
                 "size": int(t.n_bytes)}
        for t in reader.tensors
    }  # fmt: skip


def tensors(folder: Path) -> dict[str, Tensor]:
    """The file's table of tensors, as `described` kept it."""
    table = json.loads((folder / "tensors.json").read_text(encoding="utf-8"))
    return {
        name: Tensor(GGMLQuantizationType(t["kind"]), tuple(t["shape"]), t["offset"], t["size"])
        for name, t in table.items()
    }


def block_types(folder: Path) -> set[str]:
    """The block types of the file's decoder weights (blk.*), e.g. {"Q4_K", "Q6_K"}."""
    return {t.kind.name for name, t in tensors(folder).items() if name.startswith("blk.") and len(t.shape) > 1}


def described(gguf: Path, digest: str, progress: Callable[[str], None] | None = None) -> Path:
    """The cached folder of `gguf`'s config.json, tokenizer and table of tensors (made once, ~10-60 s)."""
    models = cache_dir() / "models"
    dest = models / f"{gguf.stem}-{digest[:12]}-header"
    if (dest / "config.json").is_file():
        return dest
    if progress is not None:
        progress(f"reading the tokenizer and config of {gguf.name} once (seconds)")
    models.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=models))
    try:
        reader = GGUFReader(gguf)
        with contextlib.redirect_stderr(io.StringIO()):
            AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(tmp)
            if "tokenizer.ggml.model" in reader.fields:  # a file may come without one (the tests' tiny files)
                AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(tmp)
        (tmp / "tensors.json").write_text(json.dumps(_table(reader)) + "\n", encoding="utf-8")
        (tmp / "tokenswift-source.json").write_text(json.dumps({"gguf": str(gguf)}, indent=1) + "\n", encoding="utf-8")
        with contextlib.suppress(OSError):  # another process may have put its identical copy there first
            os.rename(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def build(gguf: Path, folder: Path, config: PretrainedConfig, attn_implementation: str | None = None) -> InPlace:
    """The model of `config` (`folder`'s) with `gguf`'s tensors, read in place where they are blocks."""
    table = tensors(folder)
    mapping = np.memmap(gguf, dtype=np.uint8, mode="r")  # read-only: pages come from the file as read
    with init_empty_weights(), contextlib.redirect_stderr(io.StringIO()):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation=attn_implementation)
    to_hf = get_gguf_hf_weights_map(model, TensorProcessor())
    from_hf = {hf: name for name, hf in to_hf.items()}
    if "lm_head.weight" not in from_hf or from_hf["lm_head.weight"] not in table:
        from_hf["lm_head.weight"] = "token_embd.weight"  # a tied head reads the embedding's blocks
    kinds: dict[str, int] = {}
    copied = 0

    def tensor(hf_name: str) -> tuple[Tensor, np.ndarray]:
        name = from_hf.get(hf_name)
        if name is None or name not in table:
            raise InPlaceError(f"{gguf.name} has no tensor for {hf_name} ({name or 'unmapped'})")
        t = table[name]
        if t.offset + t.size > mapping.size:
            raise InPlaceError(f"{gguf.name} is truncated: {name} ends past the end of the file")
        return t, mapping[t.offset : t.offset + t.size]

    def values(hf_name: str) -> torch.Tensor:
        nonlocal copied
        t, data = tensor(hf_name)
        if t.kind not in _DENSE:
            raise InPlaceError(f"{gguf.name}: {hf_name} is {t.kind.name}, where float32 values were expected")
        copied += t.size
        return blocks.dequantized(torch.from_numpy(np.array(data)).view(1, -1), t.kind).view(-1)

    def rows_of(hf_name: str, width: int) -> tuple[torch.Tensor, GGMLQuantizationType]:
        nonlocal copied
        t, data = tensor(hf_name)
        kind = t.kind
        if kind in _DENSE:
            copied += t.size
            return blocks.dequantized(torch.from_numpy(np.array(data)).view(-1, t.size // t.shape[0]), kind), kind
        if not blocks.supported(kind):
            raise InPlaceError(
                f"{gguf.name}: block type {kind.name} ({hf_name}) has no kernel here; use --weights dense"
            )
        rows = blocks.as_rows(data, kind, width)
        if config.model_type == "llama" and hf_name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = config.num_attention_heads
            kv = heads if hf_name.endswith("q_proj.weight") else config.num_key_value_heads
            permuted = LlamaTensorProcessor()._reverse_permute_weights(rows.numpy(), heads, kv)
            rows = torch.from_numpy(np.ascontiguousarray(permuted))
            copied += rows.numel()
        kinds[kind.name] = kinds.get(kind.name, 0) + 1
        return rows, kind

    for name, module in list(model.named_modules()):
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        if isinstance(module, torch.nn.Linear):
            rows, kind = rows_of(f"{name}.weight", module.in_features)
            bias = None
            if module.bias is not None:
                bias = values(f"{name}.bias")
            if kind in _DENSE:
                replacement: torch.nn.Module = torch.nn.Linear(
                    module.in_features, module.out_features, bias is not None
                )
                replacement.weight.data = rows
                if bias is not None:
                    replacement.bias.data = bias
            else:
                replacement = blocks.BlockLinear(rows, kind, module.in_features, bias)
            setattr(parent, child, replacement.requires_grad_(False))
        elif isinstance(module, torch.nn.Embedding):
            rows, kind = rows_of(f"{name}.weight", module.embedding_dim)
            if kind in _DENSE:
                embedding: torch.nn.Module = torch.nn.Embedding.from_pretrained(rows, freeze=True)
            else:
                embedding = blocks.BlockEmbedding(rows, kind, module.embedding_dim)
            setattr(parent, child, embedding)
    for hf_name, parameter in list(model.named_parameters()):  # what is left: the norms (float32)
        if parameter.device.type == "meta":
            set_module_tensor_to_device(model, hf_name, "cpu", value=values(hf_name).view(parameter.shape))
    model.eval().requires_grad_(False)
    return InPlace(model, folder, kinds, copied)
