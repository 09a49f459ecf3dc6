"""Measures of a text alone (no model): Distinct-n, repeated sentences, compression, degenerate stretches.

Low perplexity alone can mean repetition, so read it with Distinct-n (distinct n-grams / n-grams,
token ids, per window), the rate of sentences that already occurred earlier in the text, and the
zlib compression ratio (raw / compressed: higher = more repetitive; English prose is about 2.5-3).

A small model's long text rarely fails everywhere at once: it slips for a few hundred tokens and
comes back. So the text is also cut into stretches of 500 tokens, and a stretch counts as degenerate
when its words run together (mean word length past 8; prose is ~4.5-5), it loops (zlib compression
of the stretch past 3.0: the 500-token stretches of the public-domain books in data/texts/
stay within 1.2-2.1, while phrase loops reach 3.1-4.6), or it lists (fewer than 3 words per non-empty
line: a list of invented names, one or two per line, compresses no better than prose; the books'
stretches hold 3.7 words per line or more, verse and a play's speaker lines included, but for one
OCR'd portrait plate at 2.8), or it chants (at least half its words in runs of 3 or more clauses that
open with the same word: "Tomorrow answered your prayers. Tomorrow buried your dead. Tomorrow
passed."; the books' stretches stay at or below 0.13, the chants of long runs reach 0.5-1.0).
"""

from __future__ import annotations

import math
import re
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tokenswift_cli.model.loading import Tokenizer

_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+|\n+")
_MIN_SENTENCE_WORDS = 4  # shorter ones ("He nodded.") repeat in any good text
STRETCH_TOKENS = 500
RUN_TOGETHER_WORD_LENGTH = 8.0
LOOP_COMPRESSION = 3.0
LIST_WORDS_PER_LINE = 3.0
CHANT_SHARE = 0.5
CHANT_RUN = 3  # clauses in a row opening with one word
_CLAUSE_END = re.compile(r"[.!?,;:\n]+")
_WORD = re.compile(r"[\w']+")


@dataclass(frozen=True)
class Stretch:
    """`STRETCH_TOKENS` tokens from `start`: the measures that flag a degenerate stretch."""

    start: int
    word_length: float
    compression: float
    words_per_line: float = math.inf
    chant: float = 0.0  # share of words in runs of clauses that open alike (`chant_share`)

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
    def chanting(self) -> bool:
        return self.chant >= CHANT_SHARE

    @property
    def degenerate(self) -> bool:
        return self.run_together or self.looping or self.listing or self.chanting


@dataclass(frozen=True)
class DistinctWindow:
    """Distinct-1..4 of tokens [start, end)."""

    start: int
    end: int
    distinct: tuple[float, float, float, float]


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


def chant_share(text: str) -> float:
    """Share of the words in runs of `CHANT_RUN`+ consecutive clauses (cut at . ! ? , ; : and line
    ends) whose first word, lower-cased, is the same: anaphora kept up for a paragraph and more."""
    clauses = [words for part in _CLAUSE_END.split(text) if (words := _WORD.findall(part.lower()))]
    chanted = start = 0
    for end in range(1, len(clauses) + 1):
        if end == len(clauses) or clauses[end][0] != clauses[start][0]:
            if end - start >= CHANT_RUN:
                chanted += sum(len(words) for words in clauses[start:end])
            start = end
    total = sum(len(words) for words in clauses)
    return chanted / total if total else 0.0


def compression_ratio(text: str) -> float:
    raw = text.encode("utf-8")
    return len(raw) / len(zlib.compress(raw, 9)) if raw else 1.0


def stretches(tokens: Sequence[int], tokenizer: Tokenizer, size: int = STRETCH_TOKENS) -> tuple[Stretch, ...]:
    """The whole stretches of `size` tokens (a shorter tail compresses less, so it is left out)."""
    found = []
    for start in range(0, len(tokens) - size + 1, size):
        text = str(tokenizer.decode(list(tokens[start : start + size])))
        found.append(
            Stretch(start, mean_word_length(text), compression_ratio(text), words_per_line(text), chant_share(text))
        )
    return tuple(found)


def degenerate_share(found: Sequence[Stretch]) -> float | None:
    return sum(s.degenerate for s in found) / len(found) if found else None


def distinct_windows(tokens: Sequence[int], size: int = 10_000) -> tuple[DistinctWindow, ...]:
    """Distinct-1..4 per window of `size` tokens; a last partial window counts if it is at least half one."""
    starts = [s for s in range(0, len(tokens), size) if s == 0 or len(tokens) - s >= size // 2]
    return tuple(DistinctWindow(s, min(s + size, len(tokens)), _distinct4(tokens[s : s + size])) for s in starts)


def _distinct4(tokens: Sequence[int]) -> tuple[float, float, float, float]:
    return (distinct_n(tokens, 1), distinct_n(tokens, 2), distinct_n(tokens, 3), distinct_n(tokens, 4))
