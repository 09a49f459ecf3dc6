"""Quality of a long text: perplexity by position, Distinct-n, repeated sentences, compression ratio.

Perplexity is the model's mean negative log-likelihood per token (nats; ppl = exp(nll)). With a
sliding `window` every token is scored from at least `window - stride` preceding tokens, at positions
below `window`: this measures local fluency and is comparable between runs of any length. With
`window=None` each token sees the whole text before it at its true position: this measures whether
the model (as loaded, e.g. with YaRN) copes with long contexts. Low perplexity alone can mean
repetition, so read it with Distinct-n (distinct n-grams / n-grams, token ids, per window), the rate of
sentences that already occurred earlier in the text, and the zlib compression ratio (raw / compressed:
higher = more repetitive; English prose is about 2.5-3).

A small model's long text rarely fails everywhere at once: it slips for a few hundred tokens and
comes back. So the text is also cut into stretches of 500 tokens, and a stretch counts as degenerate
when its words run together (mean word length past 8; prose is ~4.5-5), it loops (zlib compression
of the stretch past 3.0: the 500-token stretches of the public-domain books in data/texts/
stay within 1.2-2.1, while phrase loops reach 3.1-4.6), or it lists (fewer than 3 words per non-empty
line: a list of invented names, one or two per line, compresses no better than prose; the books'
stretches hold 3.7 words per line or more, verse and a play's speaker lines included, but for one
OCR'd portrait plate at 2.8).
"""

from __future__ import annotations

import dataclasses
import math
import re
import zlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
from transformers import DynamicCache, PreTrainedModel

from tokenswift_cli.config import ContextWindow, ModelSpec, RunConfig
from tokenswift_cli.model.loading import ModelLoadError, Tokenizer, load_model
from tokenswift_cli.sampling.scripts import Alphabet, scripts_of

_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+|\n+")
_MIN_SENTENCE_WORDS = 4  # shorter ones ("He nodded.") repeat in any good text
STRETCH_TOKENS = 500
RUN_TOGETHER_WORD_LENGTH = 8.0
LOOP_COMPRESSION = 3.0
LIST_WORDS_PER_LINE = 3.0


@dataclass(frozen=True)
class EvalWindows:
    """Table rows of `bucket` tokens, Distinct-n windows, perplexity window (None: full context) and stride."""

    bucket: int = 2048
    distinct_window: int = 10_000
    window: int | None = 2048
    stride: int = 1024
    context: ContextWindow | None = None  # full context under the engine's context window (see config.py)


@dataclass(frozen=True)
class Bucket:
    """Tokens [start, end) of the text: mean NLL (None when not computed), repeats, compression, and two
    signs of a text falling apart: the mean word length (English prose ~5; words run together past ~8)
    and the share of characters outside the scripts of the context (scripts.py)."""

    start: int
    end: int
    nll: float | None
    repeated_sentences: float
    compression: float
    word_length: float = 0.0
    foreign: float = 0.0
    degenerate: float | None = None  # share of the 500-token stretches starting here that are degenerate

    @property
    def perplexity(self) -> float | None:
        return None if self.nll is None else math.exp(self.nll)


@dataclass(frozen=True)
class Stretch:
    """`STRETCH_TOKENS` tokens from `start`: the measures that flag a degenerate stretch."""

    start: int
    word_length: float
    compression: float
    words_per_line: float = math.inf

    @property
    def run_together(self) -> bool:
        return self.word_length > RUN_TOGETHER_WORD_LENGTH

    @property
    def looping(self) -> bool:
        return self.compression > LOOP_COMPRESSION

    @property
    def listing(self) -> bool:
        return self.words_per_line < LIST_WORDS_PER_LINE

    @property
    def degenerate(self) -> bool:
        return self.run_together or self.looping or self.listing


@dataclass(frozen=True)
class DistinctWindow:
    """Distinct-1..4 of tokens [start, end)."""

    start: int
    end: int
    distinct: tuple[float, float, float, float]


@dataclass(frozen=True)
class QualityReport:
    tokens: int
    nll: float | None
    repeated_sentences: float
    compression: float
    buckets: tuple[Bucket, ...]
    distinct: tuple[DistinctWindow, ...]
    stretches: tuple[Stretch, ...] = ()

    @property
    def degenerate(self) -> float | None:
        """Share of the 500-token stretches that run words together or loop (None: shorter text)."""
        return degenerate_share(self.stretches)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@torch.no_grad()
def token_nll(
    model: PreTrainedModel,
    tokens: Sequence[int],
    *,
    window: int | None = 2048,
    stride: int = 1024,
    first: int = 1,
    context: ContextWindow | None = None,
) -> torch.Tensor:
    """NLL `[len(tokens) - first]` of tokens[first:] (first >= 1), each predicted from its prefix.

    `window` None: the whole prefix, processed in `stride`-sized chunks with a cache; with `context`,
    as the engine sees it under that context window (sinks + recent tokens).
    """
    if window is not None and not 0 < stride <= window:
        raise ValueError("the stride must be in (0, window]")
    ids = torch.tensor([int(t) for t in tokens], device=model.device)  # [n]
    first = max(1, first)
    if window is None and context is not None:
        return _nll_windowed(model, ids, stride, first, context)
    if window is None:
        return _nll_full(model, ids, stride, first)
    out: list[torch.Tensor] = []
    scored_until = first  # tokens before this one are scored already (or not wanted)
    for begin in range(0, ids.shape[0], stride):
        end = min(begin + window, ids.shape[0])
        if end > scored_until:
            out.append(_nll_span(model, ids[begin:end], max(scored_until - begin, 1), None))
            scored_until = end
        if end == ids.shape[0]:
            break
    return torch.cat(out) if out else torch.zeros(0)


def _nll_full(model: PreTrainedModel, ids: torch.Tensor, chunk: int, first: int) -> torch.Tensor:
    cache, out = DynamicCache(config=model.config), []
    for begin in range(0, ids.shape[0], chunk):
        end = min(begin + chunk, ids.shape[0])
        # Position p is predicted by the logits at p - 1: score this chunk's predictions of the next tokens.
        nll = _nll_span(model, ids[begin : min(end + 1, ids.shape[0])], 1, cache, feed=end - begin)
        keep = torch.arange(begin + 1, begin + 1 + nll.shape[0]) >= first  # [scored]
        out.append(nll[keep])
    return torch.cat(out)


def _nll_windowed(
    model: PreTrainedModel, ids: torch.Tensor, chunk: int, first: int, context: ContextWindow
) -> torch.Tensor:
    """Full-context NLL through the engine's forward and cache, under a context window."""
    from tokenswift_cli.engine.state import full_capacity, prefill_chunk
    from tokenswift_cli.model.cache import FullCache
    from tokenswift_cli.model.target import Target

    target = Target(model)
    cfg = RunConfig(max_new_tokens=ids.shape[0], prefill_chunk=chunk, window=context)
    chunk = prefill_chunk(cfg)
    cache = FullCache(target.num_layers, capacity=full_capacity(cfg, 0), window=context)
    out = []
    for begin in range(0, ids.shape[0] - 1, chunk):
        forward = target.forward(ids[begin : begin + chunk], cache)
        cache.commit(range(forward.hidden.shape[0]))
        cache.evict()
        targets = ids[begin + 1 : begin + 1 + chunk]  # [scored]
        logits = target.logits(forward.hidden[: targets.shape[0]])
        nll = torch.nn.functional.cross_entropy(logits, targets, reduction="none").cpu()
        out.append(nll[torch.arange(begin + 1, begin + 1 + nll.shape[0]) >= first])
    return torch.cat(out)


def _nll_span(
    model: PreTrainedModel, ids: torch.Tensor, skip: int, cache: DynamicCache | None, feed: int | None = None
) -> torch.Tensor:
    """NLL of ids[skip:] given ids before them; with `cache`, only ids[:feed] go through the model."""
    feed = ids.shape[0] if feed is None else feed
    start = cache.get_seq_length() if cache is not None else 0
    positions = torch.arange(start, start + feed, device=ids.device)[None]  # [1, feed]
    hidden = model.get_decoder()(  # type: ignore[no-untyped-call]
        input_ids=ids[None, :feed], position_ids=positions, past_key_values=cache, use_cache=cache is not None
    ).last_hidden_state[0]  # [feed, hidden]
    targets = ids[skip:]  # [scored]
    head = model.get_output_embeddings()  # type: ignore[no-untyped-call]
    logits = head(hidden[skip - 1 : skip - 1 + targets.shape[0]]).float()  # [scored, vocab]
    return torch.nn.functional.cross_entropy(logits, targets, reduction="none").cpu()


def distinct_n(tokens: Sequence[int], n: int) -> float:
    """Distinct n-grams over n-grams (1.0 when there are none)."""
    grams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    return len(set(grams)) / len(grams) if grams else 1.0


def sentences(text: str) -> list[str]:
    """Sentences, lower-cased with whitespace collapsed, of at least `_MIN_SENTENCE_WORDS` words."""
    parts = (" ".join(s.lower().split()) for s in _SENTENCE_END.split(text))
    return [s for s in parts if len(s.split()) >= _MIN_SENTENCE_WORDS]


def repeated_sentence_rate(text: str, seen: set[str] | None = None) -> float:
    """Fraction of sentences of `text` that occurred before (in `text` or in `seen`, which grows)."""
    seen = set() if seen is None else seen
    found = sentences(text)
    repeats = 0
    for s in found:
        repeats += s in seen
        seen.add(s)
    return repeats / len(found) if found else 0.0


def mean_word_length(text: str) -> float:
    words = text.split()
    return sum(map(len, words)) / len(words) if words else 0.0


def words_per_line(text: str) -> float:
    lines = [line for line in text.splitlines() if line.strip()]
    return sum(len(line.split()) for line in lines) / len(lines) if lines else math.inf


def compression_ratio(text: str) -> float:
    raw = text.encode("utf-8")
    return len(raw) / len(zlib.compress(raw, 9)) if raw else 1.0


def stretches(tokens: Sequence[int], tokenizer: Tokenizer, size: int = STRETCH_TOKENS) -> tuple[Stretch, ...]:
    """The whole stretches of `size` tokens (a shorter tail compresses less, so it is left out)."""
    found = []
    for start in range(0, len(tokens) - size + 1, size):
        text = str(tokenizer.decode(list(tokens[start : start + size])))
        found.append(Stretch(start, mean_word_length(text), compression_ratio(text), words_per_line(text)))
    return tuple(found)


def degenerate_share(found: Sequence[Stretch]) -> float | None:
    return sum(s.degenerate for s in found) / len(found) if found else None


def distinct_windows(tokens: Sequence[int], size: int = 10_000) -> tuple[DistinctWindow, ...]:
    """Distinct-1..4 per window of `size` tokens; a last partial window counts if it is at least half one."""
    starts = [s for s in range(0, len(tokens), size) if s == 0 or len(tokens) - s >= size // 2]
    return tuple(DistinctWindow(s, min(s + size, len(tokens)), _distinct4(tokens[s : s + size])) for s in starts)


def _distinct4(tokens: Sequence[int]) -> tuple[float, float, float, float]:
    return (distinct_n(tokens, 1), distinct_n(tokens, 2), distinct_n(tokens, 3), distinct_n(tokens, 4))


def evaluate(
    tokens: Sequence[int],
    tokenizer: Tokenizer,
    model: PreTrainedModel | None = None,
    *,
    prefix: Sequence[int] = (),
    bucket: int = 2048,
    distinct_window: int = 10_000,
    window: int | None = 2048,
    stride: int = 1024,
    context: ContextWindow | None = None,
    scripts: Sequence[str] | None = None,
) -> QualityReport:
    """Every metric for `tokens` (a text after `prefix`, which is context only); NLL when `model` is given.

    Foreign characters are those outside `scripts` (default: the scripts of `prefix`, else of the text's start).
    """
    nll = None
    if model is not None and tokens and len(prefix) + len(tokens) > 1:
        first = max(1, len(prefix))
        scored = token_nll(model, [*prefix, *tokens], window=window, stride=stride, first=first, context=context)
        nll = scored[-len(tokens) :] if prefix else torch.cat([torch.full((1,), math.nan), scored])  # [n]
    seen: set[str] = set()
    if scripts is None:  # the prefix's, else those of the text's start
        scripts = scripts_of(str(tokenizer.decode(list(prefix or tokens[:1000]))))
    alphabet = Alphabet(scripts)
    pieces = stretches(tokens, tokenizer)
    buckets = []
    for start in range(0, len(tokens), bucket):
        end = min(start + bucket, len(tokens))
        text = str(tokenizer.decode(list(tokens[start:end])))
        mean = None if nll is None else float(nll[start:end].nanmean())
        inside = [s for s in pieces if start <= s.start < end]
        buckets.append(Bucket(
            start, end, mean, repeated_sentence_rate(text, seen), compression_ratio(text), mean_word_length(text),
            alphabet.foreign_share(text), degenerate_share(inside),
        ))  # fmt: skip
    whole = str(tokenizer.decode(list(tokens)))
    return QualityReport(
        tokens=len(tokens),
        nll=None if nll is None else float(nll.nanmean()),
        repeated_sentences=repeated_sentence_rate(whole),
        compression=compression_ratio(whole),
        buckets=tuple(buckets),
        distinct=distinct_windows(tokens, distinct_window),
        stretches=pieces,
    )


def evaluate_text(
    text: str, spec: ModelSpec, *, context: str = "", windows: EvalWindows = EvalWindows(), perplexity: bool = True
) -> tuple[dict[str, Any], QualityReport]:
    """Tokenize with `spec`'s model and evaluate; for full context, the model gets its rope sized to the text.

    Returns a header (model, context tokens, rope used) and the report.
    """
    loaded = load_model(dataclasses.replace(spec, rope_scaling="none", rope_factor=None))
    if loaded.tokenizer is None:
        raise ModelLoadError(f"{spec.name} has no tokenizer: eval needs one")
    tokenizer = loaded.tokenizer
    tokens = tokenizer(text, add_special_tokens=False)["input_ids"]
    before = tokenizer(context, add_special_tokens=False)["input_ids"] if context else []
    context_window = windows.context if windows.window is None else None
    positions = len(before) + len(tokens)
    if context_window is not None:
        positions = min(positions, context_window.span)
    if perplexity and windows.window is None and spec.rope_scaling != "none":
        loaded = load_model(spec, total_tokens=positions)
    report = evaluate(
        tokens, tokenizer, loaded.model if perplexity else None, prefix=before, bucket=windows.bucket,
        distinct_window=windows.distinct_window, window=windows.window, stride=windows.stride, context=context_window,
    )  # fmt: skip
    used = loaded.spec or ModelSpec(rope_scaling="none")
    head = {"model": spec.name, "context_tokens": len(before), "full_context": windows.window is None,
            "rope": used.rope_scaling, "rope_factor": used.rope_factor,
            "context_window": dataclasses.asdict(context_window) if context_window else None}  # fmt: skip
    return head, report


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def _nll_cells(nll: float | None) -> str:
    """The NLL and perplexity cells of a table row."""
    return "- | -" if nll is None else f"{nll:.2f} | {math.exp(nll):.1f}"


def markdown(report: QualityReport) -> str:
    """The report as two markdown tables: by position, and Distinct-n per window."""
    rows = [
        "| tokens | NLL | ppl | repeated sentences | compression | word length | foreign | degenerate |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for b in report.buckets:
        rows.append(
            f"| {b.start}-{b.end} | {_nll_cells(b.nll)} | {b.repeated_sentences:.1%} "
            f"| {b.compression:.2f} | {b.word_length:.1f} | {b.foreign:.1%} | {_share(b.degenerate)} |"
        )
    rows.append(
        f"| all | {_nll_cells(report.nll)} | {report.repeated_sentences:.1%} | {report.compression:.2f} | | "
        f"| {_share(report.degenerate)} |"
    )
    rows += ["", "| tokens | distinct-1 | distinct-2 | distinct-3 | distinct-4 |", "| --- | --- | --- | --- | --- |"]
    rows += [f"| {w.start}-{w.end} | " + " | ".join(f"{d:.3f}" for d in w.distinct) + " |" for w in report.distinct]
    return "\n".join(rows)
