"""Prompt lookup over the whole text so far: a long draft where the text repeats itself.

TokenSwift's n-gram table proposes the 3 tokens that most often followed a token. When the text
repeats longer stretches (a refrain, a list's pattern, a greedy loop, a passage of the prefix quoted
again), the place where the text's last tokens occurred before predicts many more: the draft is what
followed that occurrence (prompt lookup decoding; llama.cpp's lookup decoding). An occurrence
`period` positions back predicts each token as the one `period` positions before it, drafted ones
included, so a loop shorter than the draft is followed round as often as the draft is long.

Nothing here is saved: the lookup reads the committed tokens through an index from each 3 tokens to
where they ended (a comparison over the whole text at every iteration took ~0.5 ms a step at 100K
tokens, 3% of a long run).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# A match of this many tokens before the root marks the text as repeating itself: the tuner then
# measures the plans apart from plain prose (auto/tuner.Tuners).
REPEATING = 6


@dataclass(frozen=True)
class Match:
    """The latest longest earlier occurrence of the text's end; `period` 0 when the root never occurred."""

    follow: tuple[int, ...]  # the tokens after that occurrence, up to the root (`period` tokens)
    length: int  # tokens before the root that match too, up to `TextLookup.max_match`
    period: int

    @property
    def repeating(self) -> bool:
        return self.period > 0 and self.length >= REPEATING

    def draft(self, length: int) -> tuple[int, ...]:
        """Up to `length` tokens after the root: what followed, then round the loop again."""
        out = list(self.follow[:length])
        while len(out) < length and 0 < self.period == len(self.follow):  # token i: the one `period` before it
            out.append(out[len(out) - self.period])
        return tuple(out)


NO_MATCH = Match(follow=(), length=0, period=0)


class TextLookup:
    """Finds where the text's last tokens occurred before, in the committed tokens (append-only).

    Each 3 tokens' key indexes the positions where they end, so the earlier occurrences of the text's
    last 3 tokens (the root included) are one lookup; the longest match among the latest `CANDIDATES`
    of them wins. Shorter repeats draft nothing: they predict prose badly.
    """

    KEY = 3  # tokens a match needs at least
    CANDIDATES = 256  # the latest occurrences compared further back (a loop of one token has thousands)

    def __init__(self, max_match: int = 16, max_draft: int = 64) -> None:
        self.max_match, self.max_draft = max_match, max_draft
        self._ends: dict[int, list[int]] = {}  # the 3 tokens' key -> the positions they end at, in order
        self._length = 0
        self._last: tuple[tuple[int, int], Match] | None = None  # the latest answer, by (text length, root)

    def _index(self, tokens: Sequence[int]) -> None:
        """Index the keys of the tokens committed since the last call."""
        n = len(tokens)
        for i in range(max(self._length, self.KEY - 1), n):
            self._ends.setdefault(_key(tokens[i - 2], tokens[i - 1], tokens[i]), []).append(i)
        self._length = max(self._length, n)

    def match(self, tokens: Sequence[int], root: int) -> Match:
        """The latest longest earlier match (3 to max_match + 1 tokens) of the text `tokens` + `root`.

        The latest answer is kept: the tuner and the lookup drafter both ask, once each per iteration.
        """
        key = (len(tokens), root)
        if self._last is None or self._last[0] != key:
            self._last = (key, self._find(tokens, root))
        return self._last[1]

    def _find(self, tokens: Sequence[int], root: int) -> Match:
        # Plain Python: in prose the text's last 3 tokens occurred before a few times at most, and a
        # handful of comparisons beats building tensors (~0.3 ms a step with them)
        self._index(tokens)
        n = len(tokens)
        if n < self.KEY:
            return NO_MATCH
        reach = min(self.max_match, n - 1)  # tokens compared before the root
        best_length, start = -1, -1
        for end in reversed(self._ends.get(_key(tokens[n - 2], tokens[n - 1], root), [])[-self.CANDIDATES :]):
            if tokens[end] != root:  # keys are exact: checked anyway
                continue
            length = 0
            while length < reach and end - length - 1 >= 0 and tokens[end - length - 1] == tokens[n - length - 1]:
                length += 1
            if length > best_length:  # the latest first: a later one wins a tie
                best_length, start = length, end
        if best_length < self.KEY - 1:
            return NO_MATCH
        follow = list(tokens[start + 1 : start + 1 + self.max_draft])
        return Match(follow=(*follow, root)[: self.max_draft], length=best_length, period=n - start)


def _key(a: int, b: int, c: int) -> int:
    """Three token ids in one int (exact for vocabularies below 2^21 ids)."""
    return (a << 42) | (b << 21) | c
