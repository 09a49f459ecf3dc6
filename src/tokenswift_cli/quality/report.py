"""The quality report of a text (`tokenswift eval`): perplexity and the text measures, by position.

The measures are in perplexity.py (needs the model) and text.py (the text alone); this module cuts
the text into buckets, puts them together and renders the tables.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
from transformers import PreTrainedModel

from tokenswift_cli.config import ContextWindow, ModelSpec
from tokenswift_cli.model.loading import ModelLoadError, Tokenizer, load_model
from tokenswift_cli.quality.perplexity import sampled_nll, token_nll
from tokenswift_cli.quality.text import (
    DistinctWindow,
    Stretch,
    compression_ratio,
    degenerate_share,
    distinct_windows,
    mean_word_length,
    repeated_sentence_rate,
    stretches,
)
from tokenswift_cli.sampling.scripts import Alphabet, scripts_of


@dataclass(frozen=True)
class EvalWindows:
    """Table rows of `bucket` tokens, Distinct-n windows, perplexity window (None: full context) and stride."""

    bucket: int = 2048
    distinct_window: int = 10_000
    window: int | None = 2048
    stride: int = 1024
    context: ContextWindow | None = None  # full context under the engine's context window (see config.py)
    sample: int | None = None  # judge only the first `sample` tokens of each bucket (sliding window only)


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
    sample: int | None = None,
) -> QualityReport:
    """Every metric for `tokens` (a text after `prefix`, which is context only); NLL when `model` is given.

    `sample`: the NLL of the first `sample` tokens of each bucket only (the sliding window's values there).

    Foreign characters are those outside `scripts` (default: the scripts of `prefix`, else of the text's start).
    """
    nll = None
    if model is not None and tokens and len(prefix) + len(tokens) > 1:
        first = max(1, len(prefix))
        sequence = [*prefix, *tokens]
        if sample is None or window is None:
            scored = token_nll(model, sequence, window=window, stride=stride, first=first, context=context)
        else:
            spans = [(start, start + sample) for start in range(len(prefix), len(sequence), bucket)]
            scored = sampled_nll(model, sequence, spans, window=window, stride=stride, first=first)
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
        sample=windows.sample,
    )  # fmt: skip
    used = loaded.spec or ModelSpec(rope_scaling="none")
    head = {"model": spec.name, "context_tokens": len(before), "full_context": windows.window is None,
            "rope": used.rope_scaling, "rope_factor": used.rope_factor, "judge_sample": windows.sample,
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
