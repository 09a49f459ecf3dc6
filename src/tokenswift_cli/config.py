"""Typed settings of a run. Frozen, validated in `__post_init__`, serialisable to one JSON document.

"Off" is `None`, never -1. Cross-field checks run before any model loads.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, cast

from tokenswift_cli.sampling.scripts import SCRIPTS

if TYPE_CHECKING:
    from tokenswift_cli.sampling.capitals import CapitalsRule
    from tokenswift_cli.sampling.scripts import ScriptFilter
    from tokenswift_cli.sampling.spacing import SpacingRule
    from tokenswift_cli.sampling.whitespace import WhitespaceRule
    from tokenswift_cli.sampling.word_length import WordLengthRule

SCHEMA_VERSION = 1

Mode = Literal["tokenswift", "plain"]
DraftSource = Literal["pass", "verify", "ngram", "lookup"]
DType = Literal["auto", "float32", "bfloat16", "float16"]
RopeScaling = Literal["auto", "yarn", "none"]
Weights = Literal["auto", "dense", "int4", "gguf"]
_WEIGHTS = "auto, dense, int4 or gguf"
KVCache = Literal["auto", "model", "float16", "int8"]
KV_CACHES = ("auto", "model", "float16", "int8")
DRAFT_SOURCES = ("pass", "verify", "ngram", "lookup")
DRAFT_CHOICES = ("auto", *DRAFT_SOURCES)
_BUILT = ("script_filter", "spacing_rule", "word_rule", "capitals_rule", "spaces_rule")  # from the tokenizer


class ConfigError(ValueError):
    """A setting is invalid; the message is one line meant for the user."""


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


@dataclass(frozen=True)
class SamplingConfig:
    """The target distribution. Plain and accelerated decoding apply exactly the same one.

    temperature 0 means greedy. `penalty` is TokenSwift's contextual repetition penalty theta,
    applied to the tokens among the last `penalty_window` tokens of each candidate's own path;
    `dry_multiplier` turns on DRY ("don't repeat yourself", as in llama.cpp): a token that would
    extend a repeat of `dry_allowed_length`+ earlier tokens (within `dry_range`) loses
    multiplier * base^(length - allowed) from its logit. `xtc_probability` turns on XTC ("exclude top
    choices", as in llama.cpp): at a position whose own uniform (seeded, like the draws) falls under it,
    every token at or above `xtc_threshold` probability but the least likely of them is removed.
    `scripts` names the scripts the text may use (scripts.py; () = any, ("auto",) = the prefix's,
    resolved before a run starts); the filter itself needs the tokenizer's bytes and is attached by
    `run_model.with_scripts_filter`, as is the rule of `spacing` (words kept apart: no letter right
    after `,;!?`, no capital right after a small letter; spacing.py) and of `max_word` (no word longer
    than that many characters; word_length.py), of `max_capitalised` (no more capitalised words in a row;
    capitals.py) and of `max_spaces` (no more whitespace characters in a row; whitespace.py).
    """

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    eta: float | None = None
    penalty: float | None = None
    penalty_window: int = 1024
    seed: int = 0
    suppress_token_ids: tuple[int, ...] = ()
    dry_multiplier: float | None = None
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_range: int = 4096
    xtc_probability: float | None = None
    xtc_threshold: float = 0.1
    scripts: tuple[str, ...] = ()
    script_filter: ScriptFilter | None = field(default=None, compare=False, repr=False)
    spacing: bool = False
    spacing_rule: SpacingRule | None = field(default=None, compare=False, repr=False)
    max_word: int | None = None
    word_rule: WordLengthRule | None = field(default=None, compare=False, repr=False)
    max_capitalised: int | None = None
    capitals_rule: CapitalsRule | None = field(default=None, compare=False, repr=False)
    max_spaces: int | None = None
    spaces_rule: WhitespaceRule | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        _check(math.isfinite(self.temperature) and self.temperature >= 0, "temperature must be >= 0")
        _check(self.top_k is None or self.top_k >= 1, "top-k must be >= 1")
        _check(self.top_p is None or 0 < self.top_p <= 1, "top-p must be in (0, 1]")
        _check(self.min_p is None or 0 <= self.min_p < 1, "min-p must be in [0, 1)")
        _check(self.eta is None or 0 < self.eta < 1, "eta must be in (0, 1)")
        _check(self.penalty is None or (math.isfinite(self.penalty) and self.penalty > 0), "penalty must be > 0")
        _check(self.penalty_window >= 1, "penalty window must be >= 1")
        _check(0 <= self.seed < 2**63, "seed must be in [0, 2^63)")
        dry = self.dry_multiplier
        _check(dry is None or (math.isfinite(dry) and dry > 0), "the DRY multiplier must be > 0")
        _check(math.isfinite(self.dry_base) and self.dry_base >= 1, "the DRY base must be >= 1")
        _check(self.dry_allowed_length >= 1 and self.dry_range >= 2, "DRY needs an allowed length >= 1, a range >= 2")
        xtc = self.xtc_probability
        _check(xtc is None or 0 < xtc <= 1, "the XTC probability must be in (0, 1]")
        _check(0 < self.xtc_threshold <= 0.5, "the XTC threshold must be in (0, 0.5]")
        _check(self.max_word is None or self.max_word >= 1, "the word cap must be >= 1")
        _check(self.max_capitalised is None or self.max_capitalised >= 1, "the capitals cap must be >= 1")
        _check(self.max_spaces is None or self.max_spaces >= 1, "the whitespace cap must be >= 1")
        object.__setattr__(self, "suppress_token_ids", tuple(int(t) for t in self.suppress_token_ids))
        object.__setattr__(self, "scripts", tuple(str(s) for s in self.scripts))
        unknown = [s for s in self.scripts if s not in SCRIPTS and self.scripts != ("auto",)]
        _check(not unknown, f"unknown script {', '.join(unknown)}: use any, auto or {', '.join(SCRIPTS)}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def to_dict(self) -> dict[str, Any]:
        """The settings, without what is built from the tokenizer (the scripts filter and the rules)."""
        return {k: v for k, v in dataclasses.asdict(self.unbuilt()).items() if k not in _BUILT}

    def unbuilt(self) -> SamplingConfig:
        """The settings without what is built from the tokenizer."""
        return dataclasses.replace(self, **dict.fromkeys(_BUILT))

    @property
    def context_length(self) -> int:
        """Tokens before a draw that the target distribution depends on (penalty window, DRY range, the
        word, capitals and whitespace rules)."""
        from tokenswift_cli.sampling import capitals, whitespace, word_length  # no torch: `--help` stays instant

        words = word_length.context_tokens(self.max_word) if self.max_word is not None else 0
        caps = capitals.context_tokens(self.max_capitalised) if self.max_capitalised is not None else 0
        spaces = whitespace.context_tokens(self.max_spaces) if self.max_spaces is not None else 0
        return max(self.penalty_window, self.dry_range if self.dry_multiplier is not None else 0, words, caps, spaces)


@dataclass(frozen=True)
class DraftConfig:
    """How candidates are proposed: tree template, n-gram candidates, partial KV cache for drafting.

    `tree` gives the width of each level: level 1 is the top-w of the base logits at the root, level
    i+1 the top-w of head i; all combinations are candidates. Levels beyond the number of heads are
    dropped. `partial_budget` None drafts on the full cache.
    `source` "pass" drafts with a forward of the root on the partial cache (the paper), "verify" from
    the verification pass's hidden state (Medusa-style, no extra forward), "ngram" from the n-gram
    table alone (the root's continuations: no heads), "lookup" a chain of up to `lookup_length`
    tokens, what followed the latest longest earlier match of the text's end (None: off); one
    drafter each in engine/drafters/. `auto` lets the tuner (engine/auto/) pick per iteration, from
    measured tokens/s, among plain steps, n-grams alone, lookups, and smaller and larger drafts of
    both sources; every choice writes the same text.
    """

    tree: tuple[int, ...] = (1, 3, 3, 3)
    ngram_top_k: int | None = 4
    ngram_size: int = 4
    partial_budget: int | None = 4096
    sink_tokens: int = 16
    recent_window: int = 256
    source: DraftSource = "pass"
    auto: bool = False
    lookup_length: int | None = 16

    def __post_init__(self) -> None:
        object.__setattr__(self, "tree", tuple(int(w) for w in self.tree))
        _check(self.source in DRAFT_SOURCES, f"unknown draft source {self.source!r}: use pass, verify, ngram or lookup")
        _check(len(self.tree) >= 1 and all(w >= 1 for w in self.tree), "tree widths must be >= 1, e.g. 1,3,3,3")
        _check(self.ngram_top_k is None or self.ngram_top_k >= 1, "n-gram top-k must be >= 1")
        _check(self.source != "ngram" or self.ngram_top_k is not None, "drafting from n-grams needs --ngram-top-k >= 1")
        _check(self.ngram_size >= 2, "n-gram size must be >= 2")
        _check(self.lookup_length is None or self.lookup_length >= 1, "lookup length must be >= 1")
        _check(self.source != "lookup" or self.lookup_length is not None, "drafting by lookup needs --lookup >= 1")
        _check(self.sink_tokens >= 0, "sink tokens must be >= 0")
        _check(self.recent_window >= 2, "recent window must be >= 2")
        if self.partial_budget is not None:
            _check(
                self.partial_budget >= self.sink_tokens + self.recent_window + 1,
                f"partial budget must exceed sink tokens + recent window ({self.sink_tokens + self.recent_window})",
            )

    def drafting(self, choice: str) -> DraftConfig:
        """This config with drafting `choice`: "auto" (tuned per iteration) or a fixed source (DRAFT_SOURCES)."""
        _check(choice in DRAFT_CHOICES, f"unknown drafting {choice!r}: use {', '.join(DRAFT_CHOICES)}")
        source = cast(DraftSource, "pass" if choice == "auto" else choice)
        return dataclasses.replace(self, auto=choice == "auto", source=source)


DEFAULT_SINKS = 4
KEEP_PROMPT = "prompt"
# `--keep`: how many first tokens stay attended under a context window, or the whole prompt.
Keep = int | Literal["prompt"]
KEEP_ERROR = "--keep takes a number of tokens (at least 1) or 'prompt'"


def keep_error(keep: int, size: int, what: str = "") -> str:
    """The one-line error for a kept part larger than the recent one (`what` names it, e.g. the prompt)."""
    return (
        f"--keep {what or keep} leaves {max(size, 0)} of the context window's {keep + max(size, 0)} positions "
        f"for recent text ({keep} kept): keep at most half (a smaller --keep or prompt, or a larger --context-window)"
    )


@dataclass(frozen=True)
class AutoWindow:
    """A context window fitted to the run by `run_model.fit_window`, which resolves `sinks` (a count, or
    "prompt": the whole prompt) against the prompt.

    It holds `size` recent tokens, or (None) the rest of `span` positions (None: the trained length)
    after the kept ones. It applies once a run outgrows the trained length, or always (`always`: an
    explicit `--context-window` whose kept part is the prompt).
    """

    sinks: Keep = DEFAULT_SINKS
    size: int | None = None
    span: int | None = None
    always: bool = False

    def __post_init__(self) -> None:
        _check(self.sinks == KEEP_PROMPT or (isinstance(self.sinks, int) and self.sinks >= 1), KEEP_ERROR)
        _check(not self.always or self.size is not None, "an explicit context window needs its size")
        if self.size is not None and isinstance(self.sinks, int):
            _check(self.sinks <= self.size, keep_error(self.sinks, self.size))


@dataclass(frozen=True)
class ContextWindow:
    """Attention to the first `sinks` positions and the last `size` ones only (StreamingLLM's attention
    sinks; llama.cpp's `--keep`, which `--keep` sets: with "prompt", the whole prompt).

    A token at position p sees positions p - size < j <= p and the sinks; the sinks are seen as if
    they sat just before the window (RoPE is relative: their distance never exceeds sinks + size),
    so no distance ever exceeds what the model was trained on and the cost per token stops growing.
    The kept part is at most half the span. Part of the target model: plain and accelerated decoding
    apply the same one.
    """

    size: int
    sinks: int = DEFAULT_SINKS

    def __post_init__(self) -> None:
        _check(self.size >= 16, "the context window must hold at least 16 tokens")
        _check(self.sinks >= 1, KEEP_ERROR)
        _check(self.sinks <= self.size, keep_error(self.sinks, self.size))

    @property
    def span(self) -> int:
        """The farthest distance a query looks back, plus one: the positions the model must support."""
        return self.sinks + self.size


@dataclass(frozen=True)
class RunConfig:
    """One generation: how many tokens, how (mode), the configs above, and the attention window
    (`AutoWindow` must be resolved, by `run_model.fit_window`, before the run starts).

    `kv_cache` is how the full cache stores keys and values: "model" as the model computes them,
    "float16" rounded to float16 (for a float32 model; half the bytes a step reads), "int8" in 8 bits
    with a float32 scale per 32 values (`model/kv_rows.py`; CPU, 0.56x float16's bytes), "auto" float16
    where the native CPU decoder reads it (`state.kv_storage`). Part of the target model, like the
    window: plain and accelerated decoding store alike."""

    max_new_tokens: int
    mode: Mode = "tokenswift"
    stop_at_eos: bool = False
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    draft: DraftConfig = field(default_factory=DraftConfig)
    prefill_chunk: int = 512
    window: ContextWindow | AutoWindow | None = None
    kv_cache: KVCache = "auto"
    stop: tuple[str, ...] = ()  # the text ends at the first of these (included): `--stop`

    def __post_init__(self) -> None:
        _check(self.max_new_tokens >= 1, "the number of tokens to write must be >= 1")
        object.__setattr__(self, "stop", tuple(str(s) for s in self.stop))
        _check(all(self.stop), "a --stop string must not be empty")
        _check(self.kv_cache in KV_CACHES, f"unknown KV cache {self.kv_cache!r}: use {', '.join(KV_CACHES)}")
        _check(self.mode in ("tokenswift", "plain"), f"unknown mode {self.mode!r}: use tokenswift or plain")
        _check(self.prefill_chunk >= 1, "prefill chunk must be >= 1")

    @property
    def context_window(self) -> ContextWindow | None:
        """The window of a run about to start; an `AutoWindow` must have been resolved."""
        window = self.window
        if isinstance(window, AutoWindow):
            raise ConfigError("resolve the automatic context window first (run_model.fit_window)")
        return window

    def positions_needed(self, prefix_length: int) -> int:
        """The farthest relative position the model must handle: the whole text, or the window's span."""
        total = prefix_length + self.max_new_tokens
        return total if not isinstance(self.window, ContextWindow) else min(total, self.window.span)

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(dataclasses.replace(self, sampling=self.sampling.unbuilt()))
        data["sampling"] = self.sampling.to_dict()
        return {"schema_version": SCHEMA_VERSION, **data}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunConfig:
        data = dict(data)
        version = data.pop("schema_version", SCHEMA_VERSION)
        _check(version == SCHEMA_VERSION, f"settings schema {version} is not supported (expected {SCHEMA_VERSION})")
        sampling_data = dict(data.pop("sampling"))
        # Runs recorded while the word-scope penalty existed: "token" is today's only behaviour.
        scope = sampling_data.pop("penalty_scope", "token")
        _check(scope == "token", "this run used --penalty-scope word, which was removed: start a new run")
        sampling = SamplingConfig(**sampling_data)
        draft = DraftConfig(**data.pop("draft"))
        window = data.pop("window", None)
        data.setdefault("kv_cache", "model")  # runs recorded before the option stored what the model computes
        # A resolved window records its size and sinks (what `--keep` resolved to); an unresolved one, `always`.
        auto = window and ("always" in window or "size" not in window)
        resolved = None if not window else AutoWindow(**window) if auto else ContextWindow(**window)
        return cls(sampling=sampling, draft=draft, window=resolved, **data)

    def replace(self, **changes: Any) -> RunConfig:
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class ModelSpec:
    """Which model to load and where. `name` is "default", a local folder, a .gguf file or a hub id.

    `rope_scaling` "auto" applies YaRN when a run outgrows the trained length (see rope.py), "none"
    keeps the model as configured; `rope_factor` fixes the YaRN factor (None: sized to the run).
    `weights`: "gguf" a GGUF file's own blocks in place (blocks.py), "int4" 4-bit linear layers (int4.py),
    "dense" float32; "auto" is int4 for a Q4_1 GGUF, gguf for other GGUF files on a CPU (recorded).
    """

    name: str = "default"
    dtype: DType = "auto"
    device: str = "cpu"
    rope_scaling: RopeScaling = "auto"
    rope_factor: float | None = None
    weights: Weights = "auto"

    def __post_init__(self) -> None:
        _check(bool(self.name.strip()), "model name must not be empty")
        _check(self.weights in ("auto", "dense", "int4", "gguf"), f"unknown weights {self.weights!r}: use {_WEIGHTS}")
        _check(self.dtype in ("auto", "float32", "bfloat16", "float16"), f"unknown dtype {self.dtype!r}")
        _check(
            self.device in ("cpu", "auto", "mps") or self.device.startswith("cuda"),
            f"unknown device {self.device!r}: use cpu, cuda, cuda:N or auto",
        )
        _check(self.rope_scaling in ("auto", "yarn", "none"), f"unknown rope scaling {self.rope_scaling!r}")
        factor = self.rope_factor
        _check(factor is None or (math.isfinite(factor) and factor >= 1), "rope factor must be >= 1")
        _check(factor is None or self.rope_scaling != "none", "a rope factor needs rope scaling yarn or auto")
