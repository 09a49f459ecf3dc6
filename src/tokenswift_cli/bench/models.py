"""What `tokenswift bench` runs on: the model, heads, prefix text and cases of a request."""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch

from tokenswift_cli.bench.harness import GREEDY, PAPER_SAMPLING, Bench, BenchSettings, Case, Result
from tokenswift_cli.bench.llamacpp import LlamaCpp, gguf_file
from tokenswift_cli.bench.llamacpp import available as llama_available
from tokenswift_cli.config import DEFAULT_SINKS, AutoWindow, ContextWindow, DraftConfig, KVCache, ModelSpec, RunConfig
from tokenswift_cli.data import DEFAULT_TEXT
from tokenswift_cli.engine.state import kv_storage
from tokenswift_cli.model.heads import DraftHeads, load_heads, shipped_heads
from tokenswift_cli.model.rope import apply_rope, plan_rope
from tokenswift_cli.model.target import Target
from tokenswift_cli.parsing import parse_tree, parse_window
from tokenswift_cli.runs.run_model import fit_window

DEFAULT_PREFIX = DEFAULT_TEXT
QUICK_VOCAB = 128


@dataclass(frozen=True)
class BenchRequest:
    """The options of `tokenswift bench`, parsed."""

    model: str = "default"
    dtype: str = "bfloat16"
    weights: str = "dense"
    heads: str = "default"
    lengths: tuple[int, ...] = (512, 2048)
    length_context: int = 256
    contexts: tuple[int, ...] = (2048, 8192)
    context_tokens: int = 256
    prefix_file: Path | None = None
    methods: tuple[str, ...] | None = None  # None: the four below, and llama_cpp when it is installed
    sampling: str = "paper"
    seed: int = 0
    draft: str = "auto"
    tree: str | None = None
    ngram_top_k: int | None = None
    repeats: int = 1
    threads: int | None = None
    quick: bool = False
    context_window: str = "none"
    sinks: int = DEFAULT_SINKS
    kv_cache: str = "auto"

    def cases(self) -> tuple[Case, ...]:
        by_length = [Case(self.length_context, n, "length") for n in self.lengths]
        by_context = [Case(c, self.context_tokens, "context") for c in self.contexts]
        return tuple(by_length + by_context)

    def chosen_methods(self) -> tuple[str, ...]:
        if self.methods is not None:
            return self.methods
        stock = ("plain", "tokenswift", "generate", "prompt_lookup")
        gguf = self.model == "default" or self.model.lower().endswith(".gguf")
        return stock + ("llama_cpp",) if llama_available() and gguf and not self.quick else stock

    def settings(self, window: ContextWindow | None = None) -> BenchSettings:
        if self.sampling not in ("paper", "greedy"):
            raise ValueError(f"unknown sampling {self.sampling!r}: use paper or greedy")
        sampling = dataclasses.replace(PAPER_SAMPLING if self.sampling == "paper" else GREEDY, seed=self.seed)
        draft = DraftConfig()
        changes: dict[str, Any] = {}
        if self.tree:
            changes["tree"] = parse_tree(self.tree)
        if self.ngram_top_k is not None:
            changes["ngram_top_k"] = self.ngram_top_k or None
        if self.quick:
            changes.update(partial_budget=64, sink_tokens=4, recent_window=16)
        draft = dataclasses.replace(draft, **changes).drafting(self.draft)  # a ConfigError is a ValueError
        kv_cache = RunConfig(max_new_tokens=1, kv_cache=cast(KVCache, self.kv_cache)).kv_cache  # RunConfig's check
        return BenchSettings(
            self.cases(), self.chosen_methods(), sampling, draft, self.repeats, window=window, kv_cache=kv_cache
        )


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


def _heads(choice: str, model_name: str, model: Any, fingerprint: str | None) -> DraftHeads | None:
    if choice == "none":
        return None
    if choice == "default":
        shipped = shipped_heads(model_name)
        return load_heads(shipped, model.config, fingerprint=fingerprint) if shipped else None
    return load_heads(Path(choice), model.config, fingerprint=fingerprint)


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


def open_model(request: BenchRequest) -> tuple[Target, DraftHeads | None, Any, dict[str, Any]]:
    """Target, heads, tokenizer and the model's context (rope, window) for a request; --quick: a tiny model.

    The context is resolved as `tokenswift write` resolves it for the longest case (the window, then
    YaRN past the trained length for what the window leaves), so every method runs the model users run.
    """
    longest = max(case.context + case.new_tokens for case in request.cases())
    if request.quick:
        model = quick_model(request.seed)
        if request.dtype == "bfloat16":
            model = model.to(torch.bfloat16)
        if request.weights == "int4":
            from tokenswift_cli.backends.cpu.int4 import quantize_decoder

            quantize_decoder(model)
        target, tokenizer = Target(model), None
        heads = None if request.heads == "none" else _random_heads(model)
    else:
        from tokenswift_cli.model.loading import load_model

        spec = ModelSpec(name=request.model, dtype=request.dtype, rope_scaling="none", weights=request.weights)  # type: ignore[arg-type]
        loaded = load_model(spec)
        heads = _heads(request.heads, request.model, loaded.model, loaded.fingerprint)
        if heads is not None:
            heads = heads.to(dtype=loaded.model.dtype)
        target, tokenizer = Target(loaded.model), loaded.tokenizer
    choice = RunConfig(
        max_new_tokens=longest, window=parse_window(request.context_window, request.sinks, request.model)
    )
    window = fit_window(choice, ModelSpec(), target, prefix=0).window
    assert not isinstance(window, AutoWindow)
    plan = plan_rope(ModelSpec(), target.model.config, choice.replace(window=window).positions_needed(0))
    apply_rope(target.model, plan)
    resolved = plan.resolved(ModelSpec())
    context = {"rope_scaling": resolved.rope_scaling, "rope_factor": resolved.rope_factor,
               "window": dataclasses.asdict(window) if window else None}  # fmt: skip
    return target, heads, tokenizer, context


def _random_heads(model: Any) -> DraftHeads:
    torch.manual_seed(0)
    heads = DraftHeads.for_model(model.config, 3)
    for block in heads.medusa_layers:
        torch.nn.init.normal_(block.linear.weight, std=0.1)  # type: ignore[union-attr]
    return heads.to(dtype=model.dtype).eval().requires_grad_(False)


def run_bench(request: BenchRequest, *, out_dir: Path, name: str) -> tuple[list[Result], list[Path]]:
    """Run every case, print a Rich table to stderr, write the result files; returns both."""
    from rich.console import Console

    from tokenswift_cli.bench.report import render_table, write_results

    console = Console(stderr=True, width=None if sys.stderr.isatty() else 180)
    settings = request.settings()
    if request.threads:
        torch.set_num_threads(request.threads)
    target, heads, tokenizer, context = open_model(request)
    window = context["window"]
    settings = request.settings(ContextWindow(**window) if window else None)
    needed = max(c.context for c in settings.cases)
    text = prefix_tokens(request, tokenizer, needed)
    bench = Bench(target, heads, settings, _llama(request, settings))

    stored = kv_storage(RunConfig(max_new_tokens=1, kv_cache=settings.kv_cache), target)  # "auto" resolved
    document = {"request": _jsonable(dataclasses.asdict(request)), "heads": heads is not None, "rope": context,
                "kv_cache": str(stored).removeprefix("torch."),
                "command": " ".join(["tokenswift", *sys.argv[1:]])}  # fmt: skip
    done: list[Result] = []

    def progress(result: Result) -> None:
        console.print(f"[dim]{result.case.axis} ctx={result.case.context} new={result.case.new_tokens} "
                      f"{result.method}: {result.tokens_per_second:.2f} tok/s[/]")  # fmt: skip
        done.append(result)
        write_results(out_dir, name, done, document, plot=False)  # a long run keeps what it measured

    results = bench.run(text, on_result=progress)
    model = "tiny random model" if request.quick else request.model
    title = f"tokenswift bench ({model}, {request.dtype}, {request.weights} weights, {request.sampling})"
    console.print(render_table(results, title=title))
    paths = write_results(out_dir, name, results, document)
    console.print("wrote " + ", ".join(str(p) for p in paths))
    return results, paths


def _llama(request: BenchRequest, settings: BenchSettings) -> LlamaCpp | None:
    """llama.cpp on the model's GGUF file, sized for the longest case, when the methods name it."""
    if "llama_cpp" not in settings.methods:
        return None
    if request.quick:
        raise ValueError("the llama_cpp method runs GGUF models, not the --quick tiny model")
    longest = max(case.context + case.new_tokens for case in settings.cases)
    threads = request.threads or torch.get_num_threads()
    return LlamaCpp(gguf_file(request.model), context=longest + 8, threads=threads, sampling=settings.sampling)


def _jsonable(data: dict[str, Any]) -> dict[str, Any]:
    return {k: str(v) if isinstance(v, Path) else v for k, v in data.items()}
