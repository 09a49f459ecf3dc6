"""The model of a run: loaded as its settings say, with its draft heads, rope scaling and end-of-text ids.

`write` loads the model unscaled, then `fit_rope` sizes YaRN to the run and records the resolved
spec, so that `resume` loads exactly the same model whatever its new target.
"""

from __future__ import annotations

import dataclasses
import hashlib
import platform
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from tokenswift_cli.backends.cpu import blocks, dense, int4
from tokenswift_cli.config import (
    AutoWindow,
    ConfigError,
    ContextWindow,
    ModelSpec,
    RunConfig,
    SamplingConfig,
    keep_error,
)
from tokenswift_cli.engine.state import kv_storage
from tokenswift_cli.model import kv_rows, memory
from tokenswift_cli.model.heads import SHIPPED, DraftHeads, load_heads, shipped_heads
from tokenswift_cli.model.loading import ModelLoadError, end_of_text_ids, load_model
from tokenswift_cli.model.rope import apply_rope, plan_rope, trained_length
from tokenswift_cli.model.target import Target
from tokenswift_cli.sampling.capitals import CapitalsRule
from tokenswift_cli.sampling.scripts import ScriptFilter, scripts_of, token_bytes
from tokenswift_cli.sampling.spacing import SpacingRule
from tokenswift_cli.sampling.whitespace import WhitespaceRule
from tokenswift_cli.sampling.word_length import WordLengthRule

DEFAULT_MODEL_LABEL = "SmolLM2-135M-Instruct"


@dataclass(frozen=True)
class RunModel:
    """The model of a run: target, heads, tokenizer, end-of-text ids, and what settings.json records of them."""

    target: Target
    heads: DraftHeads | None
    tokenizer: Any
    eos_ids: tuple[int, ...]
    settings: dict[str, Any]  # the model part of settings.json
    heads_settings: dict[str, Any]


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def load_run_model(spec: ModelSpec, heads: str | None, cfg: RunConfig, note: Callable[[str], None]) -> RunModel:
    """Load the model and its heads. `heads`: a path, "none", "default" (shipped heads, if any) or None.

    The rotary embedding is loaded as `spec` says; `fit_rope` sizes an "auto"/"yarn" one to the run.
    """
    note(f"loading model {spec.name} ({spec.device})")
    memory.give_back_large_blocks()
    loaded = load_model(spec)
    if loaded.tokenizer is None:
        raise ModelLoadError(f"the model {spec.name} has no tokenizer files")
    target = Target(loaded.model)
    path: Path | None = None
    if cfg.mode == "tokenswift" and heads not in (None, "none"):
        path = shipped_heads(spec.name) if heads == "default" else Path(heads).expanduser().absolute()
        if path is None and spec.name in SHIPPED:
            note(f"no trained draft heads for this model ({SHIPPED[spec.name]}): drafting without heads")
    draft_heads = None
    if path is not None:
        draft_heads = load_heads(path, loaded.model.config, fingerprint=loaded.fingerprint)
        draft_heads = draft_heads.to(device=target.output_device, dtype=loaded.model.dtype)
    label = DEFAULT_MODEL_LABEL if spec.name == "default" else Path(spec.name).name or spec.name
    weights = loaded.spec.weights if loaded.spec is not None else spec.weights  # "auto" resolved
    model_settings = {
        "spec": asdict(dataclasses.replace(spec, weights=weights)),
        "arithmetic": {"int4": int4.ARITHMETIC, "gguf": blocks.ARITHMETIC}.get(weights),
        "kv_arithmetic": kv_rows.ARITHMETIC if cfg.kv_cache == "int8" else None,
        # the dense products (layers, output head) on a CPU: the same bits on every instruction set
        "dense_arithmetic": dense.arithmetic() if dense.used_by(target.backend) else None,
        "fingerprint": loaded.fingerprint,
        "label": label,
        "source": loaded.source,
    }
    heads_settings = {
        "choice": heads,
        "path": str(path) if path else None,
        "fingerprint": _sha256(path) if path else None,
    }
    memory.trim()  # the conversions' temporaries (4-bit layers, Q8_0 head)
    return RunModel(target, draft_heads, loaded.tokenizer, end_of_text_ids(loaded), model_settings, heads_settings)


def unscaled(spec: ModelSpec) -> ModelSpec:
    return dataclasses.replace(spec, rope_scaling="none", rope_factor=None)


def fit_rope(model: RunModel, spec: ModelSpec, total_tokens: int, note: Callable[[str], None]) -> RunModel:
    """Give the model (loaded unscaled) the rope scaling `spec` asks for a run of `total_tokens` positions.

    The settings record the resolved spec ("yarn" with its factor, or "none"), so that a resume, whatever
    its target, loads exactly this model.
    """
    plan = plan_rope(spec, model.target.model.config, total_tokens)
    apply_rope(model.target.model, plan)
    warning = plan.warning()
    if warning:
        note(warning)
    resolved = plan.resolved(dataclasses.replace(spec, weights=model.settings["spec"]["weights"]))
    return dataclasses.replace(model, settings={**model.settings, "spec": asdict(resolved)})


WINDOWED_PREFILL_CHUNK = 64


def fit_window(config: RunConfig, spec: ModelSpec, target: Target, prefix: int) -> RunConfig:
    """`config` with its context window resolved. `AutoWindow` (with rope scaling "auto") gives a run
    that outgrows the model's trained length a window (of the trained length unless it says smaller),
    so that no distance exceeds what the model was trained on; a shorter run, or an explicit rope
    choice, gets none. The kept tokens are at most the `prefix` ones (as llama.cpp's `--keep`): they
    are all cached once the prefill is done. A windowed run prefills in chunks of
    `WINDOWED_PREFILL_CHUNK` tokens at most."""
    choice = config.window
    if isinstance(choice, AutoWindow):
        choice = _fit_auto(choice, config, target, prefix, fits=spec.rope_scaling == "auto" and target.lean)
    elif choice is not None:
        choice = dataclasses.replace(choice, sinks=min(choice.sinks, prefix))
    if choice is None:
        return config.replace(window=None)
    # A long run's prefill in short chunks: a 512-token chunk over a 4K window held ~300 MiB of
    # attention temporaries at its peak, a 128-token one ~50 MiB, a 64-token one half that, for 3%
    # more prefill time (measured: benchmarks/record/performance.md).
    return config.replace(window=choice, prefill_chunk=min(config.prefill_chunk, WINDOWED_PREFILL_CHUNK))


def _fit_auto(
    choice: AutoWindow, config: RunConfig, target: Target, prefix: int, *, fits: bool
) -> ContextWindow | None:
    """The window `choice` gives a run of `prefix` + `config.max_new_tokens` tokens (None: none)."""
    trained = trained_length(target.model.config)
    outgrows = prefix + config.max_new_tokens > trained
    if not choice.always and not (outgrows and fits):
        return None
    whole = not isinstance(choice.sinks, int)  # "prompt"
    keep = prefix if whole else min(int(choice.sinks), prefix)
    size = choice.size if choice.always else min(choice.size or (choice.span or trained) - keep, trained - keep)
    assert size is not None
    if keep > size:
        raise ConfigError(keep_error(keep, size, f"prompt (the whole prompt: {keep} tokens)" if whole else ""))
    return ContextWindow(size=size, sinks=keep)


def fit_kv_cache(config: RunConfig, target: Target) -> RunConfig:
    """`config` with "auto" KV storage resolved, so that the run's settings record what it stores."""
    storage = kv_storage(config, target)  # a storage this model cannot take says so before the run starts
    if config.kv_cache != "auto":
        return config
    return config.replace(kv_cache="model" if storage == target.dtype else "float16")


def suppress_eos(config: RunConfig, eos_ids: Sequence[int]) -> RunConfig:
    """Without --stop-at-eos the sampler never draws an end-of-text token (plain and accelerated alike):
    an instruct model would otherwise end its text and go on with noise."""
    if config.stop_at_eos or config.sampling.suppress_token_ids or not eos_ids:
        return config
    return config.replace(sampling=dataclasses.replace(config.sampling, suppress_token_ids=tuple(eos_ids)))


def bind_scripts(config: RunConfig, loaded: RunModel, prefix: str | None = None) -> RunConfig:
    """Resolve `--scripts auto` to the scripts of `prefix` and attach what the target distribution needs
    from the tokenizer: the scripts filter, the spacing rule and the word rule."""
    vocab_size = int(loaded.target.lm_head.out_features)
    return config.replace(sampling=with_scripts_filter(config.sampling, loaded.tokenizer, vocab_size, prefix))


def with_scripts_filter(
    sampling: SamplingConfig, tokenizer: Any, vocab_size: int, prefix: str | None = None
) -> SamplingConfig:
    """`sampling` with "auto" resolved to the scripts of `prefix`, and the scripts filter, the spacing
    rule and the word, capitals and whitespace rules (when asked for) built from `tokenizer`."""
    caps = (sampling.max_word, sampling.max_capitalised, sampling.max_spaces)
    if not sampling.spacing and not sampling.scripts and caps == (None, None, None):
        return sampling
    vocabulary = token_bytes(tokenizer)  # the bytes of the whole vocabulary, read once for all
    if sampling.spacing:
        sampling = dataclasses.replace(sampling, spacing_rule=SpacingRule(vocabulary, vocab_size))
    if sampling.max_word is not None:
        sampling = dataclasses.replace(sampling, word_rule=WordLengthRule(vocabulary, vocab_size, sampling.max_word))
    if sampling.max_capitalised is not None:
        rule = CapitalsRule(vocabulary, vocab_size, sampling.max_capitalised)
        sampling = dataclasses.replace(sampling, capitals_rule=rule)
    if sampling.max_spaces is not None:
        spaces = WhitespaceRule(vocabulary, vocab_size, sampling.max_spaces)
        sampling = dataclasses.replace(sampling, spaces_rule=spaces)
    if not sampling.scripts:
        return sampling
    names = sampling.scripts
    if names == ("auto",):
        if prefix is None:
            raise ConfigError("--scripts auto must be resolved from the prefix before the run starts")
        names = scripts_of(prefix)
    return dataclasses.replace(sampling, scripts=names, script_filter=ScriptFilter(names, vocabulary, vocab_size))


def processor(target: Target) -> dict[str, str]:
    """What computes a run's text: the device type and its name (a GPU's model), recorded in the run."""
    device = target.device
    if device.type == "cuda":
        return {"type": "cuda", "name": torch.cuda.get_device_name(device)}
    return {"type": device.type, "name": platform.machine() or device.type}
