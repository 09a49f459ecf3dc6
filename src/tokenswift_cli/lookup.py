"""Prompt lookup over the whole text so far: a long draft where the text repeats itself.

TokenSwift's n-gram table proposes the 3 tokens that most often followed a token. When the text
repeats longer stretches (a refrain, a list's pattern, a greedy loop, a passage of the prefix quoted
again), the place where the text's last tokens occurred before predicts many more: the draft is what
followed that occurrence (prompt lookup decoding; llama.cpp's lookup decoding). An occurrence
`period` positions back predicts each token as the one `period` positions before it, drafted ones
included, so a loop shorter than the draft is followed round as often as the draft is long.

Nothing here is saved: the lookup reads the committed tokens, mirrored in a growing tensor so that
one vectorised comparison finds every earlier occurrence.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

# A match of this many tokens before the root marks the text as repeating itself: the tuner then
# measures the plans apart from plain prose (autotune.Tuners).
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
    """Finds where the text's last tokens occurred before, in the committed tokens (append-only)."""

    def __init__(self, max_match: int = 16, max_draft: int = 64) -> None:
        self.max_match, self.max_draft = max_match, max_draft
        self._text = torch.empty(0, dtype=torch.int32)
        self._length = 0

    def _sync(self, tokens: Sequence[int]) -> torch.Tensor:
        """The committed tokens as a tensor; the mirror grows geometrically."""
        if len(tokens) > self._text.shape[0]:
            grown = torch.empty(max(len(tokens), 2 * self._text.shape[0], 1024), dtype=torch.int32)
            grown[: self._length] = self._text[: self._length]
            self._text = grown
        if len(tokens) > self._length:
            self._text[self._length : len(tokens)] = torch.tensor(tokens[self._length :], dtype=torch.int32)
            self._length = len(tokens)
        return self._text[: self._length]

    def match(self, tokens: Sequence[int], root: int) -> Match:
        """The latest longest earlier match of the text `tokens` + `root` (root included, 1 to max_match + 1 tokens)."""
        text = self._sync(tokens)  # [n]
        n = text.shape[0]
        ends = torch.nonzero(text == root).flatten()  # [m]: earlier occurrences of the root
        if ends.numel() == 0:
            return NO_MATCH
        back = torch.arange(1, min(self.max_match, n - 1) + 1, dtype=torch.long)  # [k]: distances before the root
        earlier = ends[:, None] - back[None]  # [m, k]
        same = (earlier >= 0) & (text[earlier.clamp(min=0)] == text[n - back][None])  # [m, k]
        matched = same.long().cumprod(-1).sum(-1)  # [m]
        best = int((matched * (n + 1) + ends).argmax())  # the longest, the latest among equals
        start = int(ends[best])
        follow = text[start + 1 : start + 1 + self.max_draft].tolist()
        return Match(follow=(*follow, root)[: self.max_draft], length=int(matched[best]), period=n - start)
