"""The spacing rule: words stay apart. No letter directly after `,` `;` `!` or `?`, and no capital
letter directly after a small one.

At temperature 1.3 the embedded model's long runs fail, when they fail, by running words together
(docs/quality.md), by two paths: commas lose their space (",the money", then
"foundalotoveramagtunedby..."), or names are glued into camel case ("#MashinAlesHera",
"SwordsCornerSpikesWild..."). Both show thousands of tokens before the failure, and once the text in
view holds them the model learns the habit from it. Public-domain books have neither (0 per 100K
characters in Paradise Lost and Othello). The rule closes both doors: after a text ending in a mark
no token may start with a letter, after a small letter none may start with a capital, and no token
may hold either pair. Digits, quotes, other marks and spaces still may ("3,000", `?!`, `,"`); glued
names such as "McDonald" become "Mcdonald". The rule depends only on the path's last token, so plain
and accelerated decoding apply it alike, as part of the target distribution (`--spacing`).
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where a mask is built: `tokenswift --help` stays instant
    import torch

MARKS = ",;!?"


def first_char(piece: bytes) -> str:
    """The whole character the bytes begin with, or "" (an incomplete or invalid start)."""
    try:
        return codecs.getincrementaldecoder("utf-8")().decode(piece[:4], final=False)[:1]
    except UnicodeDecodeError:
        return ""


def last_char(piece: bytes) -> str:
    """The whole character the bytes end with, or "" (they end inside one)."""
    for back in range(1, min(4, len(piece)) + 1):
        try:
            return piece[-back:].decode("utf-8")[-1:]
        except UnicodeDecodeError:
            continue
    return ""


def glued(before: str, after: str) -> bool:
    """Whether `after` may not follow `before` directly: a letter after a mark, a capital after a small letter."""
    return after.isalpha() and (before in MARKS or (before.islower() and after.isupper()))


def holds_glued_pair(piece: bytes) -> bool:
    """Whether one token spells a glued pair itself (",the" or "aB" in one piece)."""
    text = piece.decode("utf-8", errors="ignore")
    return any(glued(a, b) for a, b in zip(text, text[1:], strict=False))


class SpacingRule:
    """Which tokens may come next, by the character the text ends with: a mark, a small letter, or other."""

    def __init__(self, vocabulary: Sequence[bytes], vocab_size: int) -> None:
        import torch

        pieces = list(vocabulary[:vocab_size]) + [b""] * max(vocab_size - len(vocabulary), 0)
        self._vocabulary = list(vocabulary)
        firsts = [first_char(p) for p in pieces]
        always = torch.tensor([holds_glued_pair(p) for p in pieces], dtype=torch.bool)  # [vocab]
        self._banned = {
            ",": always | torch.tensor([glued(",", c) for c in firsts], dtype=torch.bool),
            "a": always | torch.tensor([glued("a", c) for c in firsts], dtype=torch.bool),
            "": always,
        }  # [vocab] each

    def banned(self, context: Sequence[int]) -> torch.Tensor:
        """Bool `[vocab]`: the tokens that may not follow `context` (the path's last tokens)."""
        return self.banned_after(self.state(context))

    def state(self, context: Sequence[int]) -> str:
        """What the mask after `context` depends on: its last character is a mark, a small letter, or other."""
        last = self._vocabulary[context[-1]] if context and context[-1] < len(self._vocabulary) else b""
        char = last_char(last)
        return "," if char and char in MARKS else "a" if char.islower() else ""

    def banned_after(self, state: str) -> torch.Tensor:
        """Bool `[vocab]`: the tokens that may not follow a text in `state`."""
        return self._banned[state]
