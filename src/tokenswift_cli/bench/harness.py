"""The side-by-side benchmark: plain decoding, TokenSwift, `generate()`, prompt lookup and llama.cpp.

Every method of a case continues the same prefix to the same length, in the same process, and the
methods take turns (their order rotates per repeat) so that drift of a shared machine hits them all.
The prefix is processed once per case; each method starts from a copy of that state, and only the
decoding is timed. Speedups are ratios of tokens per second within one case; a method that wrote
fewer tokens than asked is flagged and left out of them.
"""

from __future__ import annotations

import copy
import dataclasses
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import DynamicCache

from tokenswift_cli.bench.compare import SAMPLED, Equality, generate_gaps
from tokenswift_cli.bench.llamacpp import LlamaCpp
from tokenswift_cli.bench.stock import FirstTokenClock, generation_config, stock_generate
from tokenswift_cli.config import ModelSpec, RunConfig, SamplingConfig
from tokenswift_cli.engine.decode import generate
from tokenswift_cli.engine.metrics import Stats
from tokenswift_cli.engine.state import GenerationState, prefill
from tokenswift_cli.model.heads import DraftHeads
from tokenswift_cli.model.memory import PeakRss
from tokenswift_cli.model.target import Target
from tokenswift_cli.quality.text import distinct_n
from tokenswift_cli.runs.run_model import fit_kv_cache, fit_window

METHODS = ("plain", "tokenswift", "generate", "generate_compiled", "prompt_lookup", "llama_cpp")
ENGINE_METHODS = ("plain", "tokenswift")
HF_METHODS = ("generate", "generate_compiled", "prompt_lookup")


@dataclass(frozen=True)
class Case:
    """One point of an axis: continue the first `context` tokens of the text by `new_tokens`."""

    context: int
    new_tokens: int
    axis: str = "length"  # "length" (the paper's view) or "context" (deep into a long text)


@dataclass(frozen=True)
class BenchSettings:
    """The cases and methods, and the engine's settings as `write` takes them before a run resolves its
    window and KV cache (`run`, whose length and mode each case sets) for the model `model` names."""

    cases: tuple[Case, ...]
    run: RunConfig
    methods: tuple[str, ...] = METHODS
    model: ModelSpec = field(default_factory=ModelSpec)
    repeats: int = 1
    prompt_lookup_tokens: int = 10

    def __post_init__(self) -> None:
        unknown = set(self.methods) - set(METHODS)
        if unknown:
            raise ValueError(f"unknown methods {sorted(unknown)}; known: {', '.join(METHODS)}")
        if "plain" not in self.methods:
            raise ValueError("the benchmark needs plain decoding: every speedup is relative to it")

    @property
    def sampling(self) -> SamplingConfig:
        return self.run.sampling


@dataclass(frozen=True)
class Result:
    """One method on one case: tokens written, median decoding time and rate over the repeats."""

    case: Case
    method: str
    tokens: int
    seconds: float
    tokens_per_second: float
    peak_rss_mb: float
    distinct: tuple[float, float, float, float]
    alpha: float | None = None
    beta: float | None = None
    mean_accepted: float | None = None
    equal_to_plain: bool | None = None
    first_divergence: int | None = None
    not_compared_to_plain: tuple[str, ...] = ()  # why not (compare.generate_gaps), when not
    equal_to_generate: bool | None = None
    generate_divergence: int | None = None
    not_compared_to_generate: tuple[str, ...] = ()
    speedup_plain: float | None = None  # tokens/s over plain's; None when either wrote fewer tokens than asked
    speedup_generate: float | None = None
    phases: dict[str, float] | None = None

    @property
    def complete(self) -> bool:
        return self.tokens >= self.case.new_tokens

    @property
    def to_plain(self) -> Equality:
        return Equality(self.equal_to_plain, self.first_divergence, self.not_compared_to_plain)

    @property
    def to_generate(self) -> Equality:
        return Equality(self.equal_to_generate, self.generate_divergence, self.not_compared_to_generate)

    @property
    def ms_per_token(self) -> float:
        return 1000 / self.tokens_per_second if self.tokens_per_second else 0.0

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data.update(ms_per_token=self.ms_per_token, complete=self.complete)
        return data


@dataclass(frozen=True)
class _Run:
    tokens: list[int]
    seconds: float
    peak_rss_mb: float
    stats: Stats | None = None
    timed_tokens: int | None = None  # tokens decoded in `seconds` when not all of them

    @property
    def tokens_per_second(self) -> float:
        count = len(self.tokens) if self.timed_tokens is None else self.timed_tokens
        return count / self.seconds if self.seconds > 0 else 0.0


class Bench:
    """Runs the methods of `settings` on one model; `heads` None drafts with the base model and n-grams.

    `llama` is the llama.cpp context of the model's GGUF file, needed when the methods name llama_cpp.
    """

    def __init__(
        self, target: Target, heads: DraftHeads | None, settings: BenchSettings, llama: LlamaCpp | None = None
    ) -> None:
        if "llama_cpp" in settings.methods and llama is None:
            raise ValueError("the llama_cpp method needs a llama.cpp context of the model")
        self.target, self.heads, self.settings, self.llama = target, heads, settings, llama

    def run(self, text_tokens: Sequence[int], on_result: Callable[[Result], None] | None = None) -> list[Result]:
        results = []
        for case in self.settings.cases:
            if case.context > len(text_tokens):
                raise ValueError(f"the prefix text has {len(text_tokens)} tokens, the case needs {case.context}")
            for result in self.run_case(case, list(text_tokens[: case.context])):
                results.append(result)
                if on_result is not None:
                    on_result(result)
        return results

    def run_case(self, case: Case, prompt: list[int]) -> list[Result]:
        """Every method on one case, interleaved over the repeats, then compared."""
        methods = self.settings.methods
        runs: dict[str, list[_Run]] = {m: [] for m in methods}
        config = self.config("tokenswift", case)
        engine_state = prefill(self.target, prompt, config)
        hf_cache = self._hf_prefill(prompt) if set(methods) & set(HF_METHODS) else None
        for repeat in range(self.settings.repeats):
            shift = repeat % len(methods)
            for method in methods[shift:] + methods[:shift]:
                if method in ENGINE_METHODS:
                    runs[method].append(self._engine(method, case, engine_state))
                elif method == "llama_cpp":
                    runs[method].append(self._llama_cpp(case, prompt))
                else:
                    assert hf_cache is not None
                    runs[method].append(self._hf(method, case, prompt, hf_cache))
        return _compare(case, runs, generate_gaps(config, self.target, case.context))

    def config(self, method: str, case: Case) -> RunConfig:
        """The engine's settings for `case`, resolved as `write` resolves them for a run of that prefix and length."""
        mode = "plain" if method == "plain" else "tokenswift"
        run = self.settings.run.replace(max_new_tokens=case.new_tokens, mode=mode)
        return fit_kv_cache(fit_window(run, self.settings.model, self.target, case.context), self.target)

    def _engine(self, method: str, case: Case, prefilled: GenerationState) -> _Run:
        cfg = self.config(method, case)
        state = copy.deepcopy(prefilled)
        state.stats = Stats()
        if method == "plain":
            state.partial = None  # plain decoding never drafts: keep no partial cache up to date
        heads = self.heads if method == "tokenswift" else None
        with PeakRss() as peak:
            start = time.perf_counter()
            for _ in generate(self.target, heads, state, cfg):
                pass
            seconds = time.perf_counter() - start
        return _Run(state.generated[: case.new_tokens], seconds, peak.mb, state.stats)

    def _hf_prefill(self, prompt: list[int]) -> DynamicCache:
        """The stock model's cache of all prompt tokens but the last (generate() processes that one)."""
        model = self.target.model
        cache = DynamicCache()
        with stock_generate(model), torch.no_grad():
            for start in range(0, len(prompt) - 1, 1024):
                chunk = torch.tensor([prompt[start : min(start + 1024, len(prompt) - 1)]], device=self.target.device)
                model(input_ids=chunk, past_key_values=cache, use_cache=True)
        return cache

    def _hf(self, method: str, case: Case, prompt: list[int], prefilled: DynamicCache) -> _Run:
        """`generate()` from the prefilled cache; prompt lookup and the compiled loop (a static cache, which
        `generate()` compiles with torch.compile) from scratch (with a prefilled cache prompt lookup
        writes another text in transformers 5.23), timed from the first new token by a streamer; the compiled
        loop is called once untimed first, so its compilation is not counted."""
        model, sampling = self.target.model, self.settings.sampling
        config = generation_config(sampling, case.new_tokens)
        lookup = method == "prompt_lookup"
        if lookup:
            config.prompt_lookup_num_tokens = self.settings.prompt_lookup_tokens
        if method == "generate_compiled":
            config.cache_implementation = "static"
        from_scratch = method != "generate"
        extra: dict[str, Any] = (
            {"streamer": FirstTokenClock()} if from_scratch else {"past_key_values": copy.deepcopy(prefilled)}
        )
        ids = torch.tensor([prompt], device=self.target.device)
        if method == "generate_compiled":  # torch.compile compiles in the first call: a user's later calls don't
            with stock_generate(model), torch.no_grad():
                model.generate(ids, generation_config=config, streamer=FirstTokenClock())
        torch.manual_seed(sampling.seed)
        with stock_generate(model), PeakRss() as peak, torch.no_grad():
            start = time.perf_counter()
            out = model.generate(ids, generation_config=config, **extra)
            end = time.perf_counter()
        tokens = out[0, len(prompt) :].tolist()
        clock = extra.get("streamer")
        if clock is not None and clock.first is not None:  # decoding only: drop prefill and first step
            return _Run(tokens, end - clock.first, peak.mb, timed_tokens=len(tokens) - clock.first_count)
        return _Run(tokens, end - start, peak.mb)

    def _llama_cpp(self, case: Case, prompt: list[int]) -> _Run:
        assert self.llama is not None
        with PeakRss() as peak:
            timed = self.llama.continue_text(prompt, case.new_tokens)
        return _Run(timed.tokens, timed.seconds, peak.mb, timed_tokens=timed.timed_tokens)


def _equalities(
    method: str, tokens: list[int], texts: dict[str, list[int]], gaps: tuple[str, ...]
) -> tuple[Equality, Equality]:
    """The text of `method` against plain's and against generate()'s (not against itself, nor llama.cpp's:
    another implementation of the model, compared for speed only)."""
    if method == "llama_cpp":
        return Equality(), Equality()
    engine = method in ENGINE_METHODS
    # Two texts of one side (engine / transformers) share its rules; across sides they must share all.
    to_plain = Equality() if method == "plain" else Equality.of(tokens, texts["plain"], () if engine else gaps)
    if method == "generate" or "generate" not in texts:
        return to_plain, Equality()
    if engine:
        return to_plain, Equality.of(tokens, texts["generate"], gaps)
    return to_plain, Equality.of(tokens, texts["generate"], tuple(g for g in gaps if g == SAMPLED))


def _compare(case: Case, runs: dict[str, list[_Run]], gaps: tuple[str, ...]) -> list[Result]:
    """Median times and rates per method, speedups (tokens/s ratios) within the case, equality of the texts."""
    rate = {m: statistics.median(r.tokens_per_second for r in rs) for m, rs in runs.items()}
    texts = {m: rs[0].tokens for m, rs in runs.items()}
    complete = {m: len(texts[m]) >= case.new_tokens for m in runs}

    def speedup(method: str, over: str) -> float | None:
        if over not in rate or not (complete[method] and complete[over]) or not rate[over]:
            return None  # never a ratio of runs of different lengths
        return rate[method] / rate[over]

    results = []
    for method, method_runs in runs.items():
        run = method_runs[0]
        stats = run.stats if method == "tokenswift" else None
        to_plain, to_generate = _equalities(method, run.tokens, texts, gaps)
        results.append(Result(
            case=case, method=method, tokens=len(run.tokens), seconds=statistics.median(r.seconds for r in method_runs),
            tokens_per_second=rate[method], peak_rss_mb=max(r.peak_rss_mb for r in method_runs),
            distinct=tuple(distinct_n(run.tokens, n) for n in (1, 2, 3, 4)),  # type: ignore[arg-type]
            alpha=stats.alpha if stats else None, beta=stats.beta if stats else None,
            mean_accepted=stats.mean_accepted if stats else None,
            equal_to_plain=to_plain.equal, first_divergence=to_plain.divergence, not_compared_to_plain=to_plain.gaps,
            equal_to_generate=to_generate.equal, generate_divergence=to_generate.divergence,
            not_compared_to_generate=to_generate.gaps,
            speedup_plain=speedup(method, "plain"), speedup_generate=speedup(method, "generate"),
            phases=dict(run.stats.seconds) if run.stats else None,
        ))  # fmt: skip
    return results
