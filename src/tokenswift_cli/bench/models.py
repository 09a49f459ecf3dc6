"""What `tokenswift bench` runs on: the model, heads, prefix text, cases and settings of a request.

The defaults are `tokenswift write`'s, resolved by the same functions: the model's dtype and weights
(`--dtype auto`, `--weights auto`), its measured sampling (`sampling.defaults`), `--context-window
auto` and `--kv-cache auto` (per case, by `run_model.fit_window` / `fit_kv_cache`), the rope scaling,
the suppressed end-of-text tokens and the scripts filter. `--sampling greedy` is the comparison with
`generate()` instead: only the rules it implements, the window and KV cache as it computes them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch

from tokenswift_cli.bench.harness import BenchSettings, Case
from tokenswift_cli.bench.llamacpp import available as llama_available
from tokenswift_cli.config import (
    DEFAULT_SINKS,
    DraftConfig,
    DType,
    Keep,
    KVCache,
    ModelSpec,
    RunConfig,
    SamplingConfig,
    Weights,
)
from tokenswift_cli.data import DEFAULT_TEXT
from tokenswift_cli.model.heads import DraftHeads
from tokenswift_cli.model.target import Target
from tokenswift_cli.parsing import parse_tree, parse_window
from tokenswift_cli.runs.run_model import (
    RunModel,
    bind_scripts,
    fit_rope,
    fit_window,
    load_run_model,
    suppress_eos,
    unscaled,
)  # fmt: skip
from tokenswift_cli.sampling.defaults import PAPER, default_sampling

DEFAULT_PREFIX = DEFAULT_TEXT
QUICK_VOCAB = 128
QUICK_MODEL = "tiny random model"  # not the embedded model: its defaults are those of any other model
SAMPLINGS = ("default", "paper", "greedy")


@dataclass(frozen=True)
class BenchRequest:
    """The options of `tokenswift bench`, parsed. `context_window` / `kv_cache` None: write's "auto",
    or under greedy what `generate()` computes ("none", "model")."""

    model: str = "default"
    device: str = "cpu"
    dtype: str = "auto"
    weights: str = "auto"
    heads: str = "default"
    lengths: tuple[int, ...] = (512, 2048)
    length_context: int = 256
    contexts: tuple[int, ...] = (2048, 8192)
    context_tokens: int = 256
    prefix_file: Path | None = None
    methods: tuple[str, ...] | None = None  # None: the four below, and llama_cpp when it is installed
    sampling: str = "default"
    seed: int = 0
    draft: str = "auto"
    tree: str | None = None
    ngram_top_k: int | None = None
    repeats: int = 1
    threads: int | None = None
    quick: bool = False
    context_window: str | None = None
    keep: Keep = DEFAULT_SINKS
    kv_cache: str | None = None

    def cases(self) -> tuple[Case, ...]:
        by_length = [Case(self.length_context, n, "length") for n in self.lengths]
        by_context = [Case(c, self.context_tokens, "context") for c in self.contexts]
        return tuple(by_length + by_context)

    def chosen_methods(self) -> tuple[str, ...]:
        if self.methods is not None:
            return self.methods
        stock: tuple[str, ...] = ("plain", "tokenswift", "generate", "prompt_lookup")
        if self.device.startswith("cuda"):  # the fast stock loop where it exists: static cache + torch.compile
            stock = ("plain", "tokenswift", "generate", "generate_compiled")
        gguf = self.model == "default" or self.model.lower().endswith(".gguf")
        return stock + ("llama_cpp",) if llama_available() and gguf and not self.quick else stock

    @property
    def model_name(self) -> str:
        """The name the defaults are chosen by."""
        return QUICK_MODEL if self.quick else self.model

    def model_spec(self) -> ModelSpec:
        """The model as `write` asks for it (rope scaling "auto": YaRN once a run outgrows the trained length)."""
        return ModelSpec(
            name=self.model_name, device=self.device, dtype=cast(DType, self.dtype), weights=cast(Weights, self.weights)
        )

    def sampling_config(self) -> SamplingConfig:
        presets = {"default": default_sampling(self.model_name), "paper": PAPER, "greedy": SamplingConfig()}
        if self.sampling not in presets:
            raise ValueError(f"unknown sampling {self.sampling!r}: use {', '.join(SAMPLINGS)}")
        return dataclasses.replace(presets[self.sampling], seed=self.seed)

    def run_config(self) -> RunConfig:
        """The engine's settings as `write` builds them from its flags, before the model resolves them."""
        if not self.cases():
            raise ValueError("no cases: give --lengths or --contexts")
        changes: dict[str, Any] = {}
        if self.tree:
            changes["tree"] = parse_tree(self.tree)
        if self.ngram_top_k is not None:
            changes["ngram_top_k"] = self.ngram_top_k or None
        if self.quick:
            changes.update(partial_budget=64, sink_tokens=4, recent_window=16)
        draft = dataclasses.replace(DraftConfig(), **changes).drafting(self.draft)  # a ConfigError is a ValueError
        exact = self.sampling == "greedy"
        window = self.context_window or ("none" if exact else "auto")
        return RunConfig(
            max_new_tokens=max(case.new_tokens for case in self.cases()), sampling=self.sampling_config(),
            draft=draft, window=parse_window(window, self.keep, self.model_name),
            kv_cache=cast(KVCache, self.kv_cache or ("model" if exact else "auto")),
        )  # fmt: skip

    def settings(self, run: RunConfig) -> BenchSettings:
        return BenchSettings(self.cases(), run, self.chosen_methods(), model=self.model_spec(), repeats=self.repeats)


@dataclass(frozen=True)
class BenchModel:
    """A request's model (rope fitted), prefix tokens, and engine settings (end-of-text tokens and scripts
    bound; each case's window and KV cache are resolved by `Bench.config`)."""

    model: RunModel
    run: RunConfig
    prefix: list[int]

    @property
    def target(self) -> Target:
        return self.model.target

    @property
    def heads(self) -> DraftHeads | None:
        return self.model.heads


def open_model(request: BenchRequest, note: Callable[[str], None] = lambda _: None) -> BenchModel:
    """Load the model of `request` and resolve its settings as `tokenswift write` does; --quick: a tiny model."""
    run, spec, cases = request.run_config(), request.model_spec(), request.cases()
    loaded = _quick(request, spec) if request.quick else load_run_model(unscaled(spec), request.heads, run, note)
    prefix = prefix_tokens(request, loaded.tokenizer, max(case.context for case in cases))
    # The rope, sized as write sizes it, for the case that reaches farthest.
    fitted = [(fit_window(run.replace(max_new_tokens=c.new_tokens), spec, loaded.target, c.context), c) for c in cases]
    positions = max(config.positions_needed(case.context) for config, case in fitted)
    loaded = fit_rope(loaded, spec, positions, note)
    text = None if loaded.tokenizer is None else loaded.tokenizer.decode(prefix)
    return BenchModel(loaded, bind_scripts(suppress_eos(run, loaded.eos_ids), loaded, text), prefix)


def quick_model(seed: int = 0) -> Any:
    """A tiny random llama (two layers, GQA) whose output is not flat: for tests and `--quick`."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=QUICK_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=8192,
        tie_word_embeddings=False, bos_token_id=0, eos_token_id=None, pad_token_id=None,
    )  # fmt: skip
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    with torch.no_grad():
        model.get_output_embeddings().weight.normal_(0.0, 0.35)
    return model.eval()


def _quick(request: BenchRequest, spec: ModelSpec) -> RunModel:
    """The tiny model as a run's model: float32 (unless asked for bfloat16), no tokenizer, no end-of-text token."""
    model = quick_model(request.seed)
    if request.dtype in ("bfloat16", "float16"):
        model = model.to(getattr(torch, request.dtype))
    if request.device != "cpu":
        model = model.to(request.device)
    if request.weights == "int4":
        from tokenswift_cli.backends.cpu.int4 import quantize_decoder

        quantize_decoder(model)
    heads = None if request.heads == "none" else _random_heads(model)
    dtype = cast(DType, str(model.dtype).removeprefix("torch."))
    resolved = dataclasses.replace(spec, dtype=dtype, weights="int4" if request.weights == "int4" else "dense")
    settings = {"spec": dataclasses.asdict(resolved), "fingerprint": None, "label": QUICK_MODEL, "source": ""}
    no_file = {"choice": request.heads, "path": None, "fingerprint": None}
    return RunModel(Target(model), heads, tokenizer=None, eos_ids=(), settings=settings, heads_settings=no_file)


def _random_heads(model: Any) -> DraftHeads:
    torch.manual_seed(0)
    heads = DraftHeads.for_model(model.config, 3)
    for block in heads.medusa_layers:
        torch.nn.init.normal_(block.linear.weight, std=0.1)  # type: ignore[union-attr]
    return heads.to(device=model.device, dtype=model.dtype).eval().requires_grad_(False)


def prefix_tokens(request: BenchRequest, tokenizer: Any, needed: int) -> list[int]:
    """The first `needed` tokens of the prefix text (random tokens for --quick)."""
    if request.quick:
        generator = torch.Generator().manual_seed(request.seed + 1)
        return torch.randint(2, QUICK_VOCAB, (needed,), generator=generator).tolist()
    path = request.prefix_file or DEFAULT_PREFIX
    if not path.is_file():
        raise ValueError(f"prefix file not found: {path} (use --prefix-file)")
    text = path.read_text(encoding="utf-8", errors="replace")
    tokens: list[int] = tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(tokens) < needed:
        raise ValueError(f"{path} has {len(tokens)} tokens; the longest case needs {needed}")
    return tokens[:needed]
