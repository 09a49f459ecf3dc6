"""The side-by-side benchmark: plain decoding, TokenSwift, `generate()`, prompt lookup and llama.cpp.

Every method of a case continues the same prefix with the same settings in the same process, and the
methods take turns (their order rotates per repeat) so that drift of a shared machine hits them all.
The prefix is processed once per case; each method starts from a copy of that state, and only the
decoding is timed. Speedups are ratios of decoding times within one case.
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
from transformers import DynamicCache, GenerationConfig

from tokenswift_cli.bench.llamacpp import LlamaCpp
from tokenswift_cli.config import ContextWindow, DraftConfig, KVCache, RunConfig, SamplingConfig
from tokenswift_cli.engine.decode import generate
from tokenswift_cli.engine.metrics import Stats
from tokenswift_cli.engine.state import GenerationState, prefill
from tokenswift_cli.model.heads import DraftHeads
from tokenswift_cli.model.memory import PeakRss
from tokenswift_cli.model.target import Target
from tokenswift_cli.quality.text import distinct_n

METHODS = ("plain", "tokenswift", "generate", "prompt_lookup", "llama_cpp")
ENGINE_METHODS = ("plain", "tokenswift")
HF_METHODS = ("generate", "prompt_lookup")
PAPER_SAMPLING = SamplingConfig(temperature=1.0, min_p=0.1, penalty=1.2, penalty_window=1024)
GREEDY = SamplingConfig()


@dataclass(frozen=True)
class Case:
    """One point of an axis: continue the first `context` tokens of the text by `new_tokens`."""

    context: int
    new_tokens: int
    axis: str = "length"  # "length" (the paper's view) or "context" (deep into a long text)


@dataclass(frozen=True)
class BenchSettings:
    cases: tuple[Case, ...]
    methods: tuple[str, ...] = METHODS
    sampling: SamplingConfig = PAPER_SAMPLING
    draft: DraftConfig = field(default_factory=DraftConfig)
    repeats: int = 1
    prompt_lookup_tokens: int = 10
    window: ContextWindow | None = None  # the engine's; the other methods attend to everything
    kv_cache: KVCache = "auto"  # the engine's storage (`RunConfig.kv_cache`)

    def __post_init__(self) -> None:
        unknown = set(self.methods) - set(METHODS)
        if unknown:
            raise ValueError(f"unknown methods {sorted(unknown)}; known: {', '.join(METHODS)}")
        if "plain" not in self.methods:
            raise ValueError("the benchmark needs plain decoding: every speedup is relative to it")


@dataclass(frozen=True)
class Result:
    """One method on one case (median time over the repeats)."""

    case: Case
    method: str
    tokens: int
    seconds: float
    peak_rss_mb: float
    distinct: tuple[float, float, float, float]
    alpha: float | None = None
    beta: float | None = None
    mean_accepted: float | None = None
    equal_to_plain: bool | None = None
    first_divergence: int | None = None
    speedup_plain: float | None = None
    speedup_generate: float | None = None
    phases: dict[str, float] | None = None

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    @property
    def ms_per_token(self) -> float:
        return 1000 * self.seconds / self.tokens if self.tokens else 0.0

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data.update(tokens_per_second=self.tokens_per_second, ms_per_token=self.ms_per_token)
        return data


@dataclass(frozen=True)
class _Run:
    tokens: list[int]
    seconds: float
    peak_rss_mb: float
    stats: Stats | None = None
    timed_tokens: int | None = None  # tokens decoded in `seconds` when not all of them

    @property
    def seconds_per_token(self) -> float:
        count = len(self.tokens) if self.timed_tokens is None else self.timed_tokens
        return self.seconds / max(count, 1)


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first differing token, None when equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


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
        """Every method on one case, interleaved over the repeats, then compared with plain."""
        methods = self.settings.methods
        runs: dict[str, list[_Run]] = {m: [] for m in methods}
        engine_state = prefill(self.target, prompt, self._config("tokenswift", case))
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
        return _compare(case, runs)

    def _config(self, method: str, case: Case) -> RunConfig:
        mode = "plain" if method == "plain" else "tokenswift"
        return RunConfig(max_new_tokens=case.new_tokens, mode=mode, sampling=self.settings.sampling,
                         draft=self.settings.draft, window=self.settings.window,
                         kv_cache=self.settings.kv_cache)  # fmt: skip

    def _engine(self, method: str, case: Case, prefilled: GenerationState) -> _Run:
        cfg = self._config(method, case)
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
        with _stock_attention(model), torch.no_grad():
            for start in range(0, len(prompt) - 1, 1024):
                chunk = torch.tensor([prompt[start : min(start + 1024, len(prompt) - 1)]], device=self.target.device)
                model(input_ids=chunk, past_key_values=cache, use_cache=True)
        return cache

    def _hf(self, method: str, case: Case, prompt: list[int], prefilled: DynamicCache) -> _Run:
        """`generate()` from the prefilled cache; prompt lookup from scratch (with a prefilled cache it
        writes another text in transformers 5.23), timed from its first new token by a streamer."""
        model, sampling = self.target.model, self.settings.sampling
        config = _generation_config(model, sampling, case.new_tokens)
        lookup = method == "prompt_lookup"
        if lookup:
            config.prompt_lookup_num_tokens = self.settings.prompt_lookup_tokens
        extra: dict[str, Any] = (
            {"streamer": _FirstTokenClock()} if lookup else {"past_key_values": copy.deepcopy(prefilled)}
        )
        ids = torch.tensor([prompt], device=self.target.device)
        torch.manual_seed(sampling.seed)
        with _stock_attention(model), PeakRss() as peak, torch.no_grad():
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


class _FirstTokenClock:
    """A `generate()` streamer that notes when the first new tokens arrive (after the prompt)."""

    def __init__(self) -> None:
        self.calls, self.first_count = 0, 0
        self.first: float | None = None

    def put(self, value: torch.Tensor) -> None:
        self.calls += 1
        if self.calls == 2:
            self.first, self.first_count = time.perf_counter(), int(value.numel())

    def end(self) -> None:
        pass


class _stock_attention:
    """Runs the stock model with its default `sdpa` attention (what `generate()` users get)."""

    def __init__(self, model: Any) -> None:
        self.model, self.before = model, model.config._attn_implementation

    def __enter__(self) -> None:
        self.model.set_attn_implementation("sdpa")

    def __exit__(self, *exc: object) -> None:
        self.model.set_attn_implementation(self.before)


def _generation_config(model: Any, sampling: SamplingConfig, new_tokens: int) -> GenerationConfig:
    """`generate()` settings closest to ours: no EOS stop, same temperature / min-p / penalty."""
    config = GenerationConfig(max_new_tokens=new_tokens, min_new_tokens=0, eos_token_id=None, pad_token_id=0)
    config.do_sample = not sampling.greedy
    if sampling.penalty is not None:
        config.repetition_penalty = sampling.penalty  # note: over the whole text, not a window
    if not sampling.greedy:
        config.temperature, config.top_k, config.top_p = sampling.temperature, sampling.top_k or 0, sampling.top_p
        config.min_p = sampling.min_p
    return config


def _compare(case: Case, runs: dict[str, list[_Run]]) -> list[Result]:
    """Median times per method, speedups within the case, equality of each text with plain's."""
    per_token = {m: statistics.median(r.seconds_per_token for r in rs) for m, rs in runs.items()}
    seconds = {m: per_token[m] * len(rs[0].tokens) for m, rs in runs.items()}  # the whole length, at that rate
    plain = runs["plain"][0].tokens
    results = []
    for method, method_runs in runs.items():
        run = method_runs[0]
        stats = run.stats if method == "tokenswift" else None
        divergence = None if method == "llama_cpp" else first_divergence(run.tokens, plain)  # its own model
        results.append(Result(
            case=case, method=method, tokens=len(run.tokens), seconds=seconds[method],
            peak_rss_mb=max(r.peak_rss_mb for r in method_runs),
            distinct=tuple(distinct_n(run.tokens, n) for n in (1, 2, 3, 4)),  # type: ignore[arg-type]
            alpha=stats.alpha if stats else None, beta=stats.beta if stats else None,
            mean_accepted=stats.mean_accepted if stats else None,
            equal_to_plain=None if method == "llama_cpp" else divergence is None, first_divergence=divergence,
            speedup_plain=seconds["plain"] / seconds[method] if seconds[method] else None,
            speedup_generate=seconds["generate"] / seconds[method] if "generate" in seconds else None,
            phases=dict(run.stats.seconds) if run.stats else None,
        ))  # fmt: skip
    return results
