"""The spacing rule: the sampler never draws a letter directly after `,` `;` `!` or `?`.

In the embedded model's long runs at temperature 1.3, words run together late (",the money",
then "foundalotoveramagtunedby...") and the first sign comes thousands of tokens before: the
share of these marks followed directly by a letter climbs from 0 to 0.3-0.9 (docs/quality.md,
session 16). Once the text in view writes ",the", the model learns the habit from it. The rule
closes that door: a token that starts with a letter may not follow a text ending in one of the
marks, and no token may hold a mark followed by a letter. Digits, quotes, other marks and spaces
still may ("3,000", `?!`, `,"`). It depends only on the path's last token, so plain and
accelerated decoding apply it alike, as part of the target distribution (`--spacing`).
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where a mask is built: `tokenswift --help` stays instant
    import torch

MARKS = b",;!?"


def starts_with_letter(piece: bytes) -> bool:
    """Whether the bytes begin with a whole letter (an ASCII one, or a complete non-ASCII character)."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="strict")
    try:
        text = decoder.decode(piece[:4], final=False)
    except UnicodeDecodeError:
        return False
    return bool(text) and text[0].isalpha()


def holds_mark_then_letter(piece: bytes) -> bool:
    """Whether one token spells a mark followed directly by a letter (",the" in one piece)."""
    return any(byte in MARKS and starts_with_letter(piece[i + 1 :]) for i, byte in enumerate(piece[:-1]))


class SpacingRule:
    """Which tokens may come next: a mask for a text ending in a mark, another for any other text."""

    def __init__(self, vocabulary: Sequence[bytes], vocab_size: int) -> None:
        import torch

        pieces = list(vocabulary[:vocab_size]) + [b""] * max(vocab_size - len(vocabulary), 0)
        self._vocabulary = list(vocabulary)
        self._always = torch.tensor([holds_mark_then_letter(p) for p in pieces], dtype=torch.bool)  # [vocab]
        letters = torch.tensor([starts_with_letter(p) for p in pieces], dtype=torch.bool)  # [vocab]
        self._after_mark = self._always | letters  # [vocab]

    def banned(self, context: Sequence[int]) -> torch.Tensor:
        """Bool `[vocab]`: the tokens that may not follow `context` (the path's last tokens)."""
        last = self._vocabulary[context[-1]] if context and context[-1] < len(self._vocabulary) else b""
        return self._after_mark if last[-1:] and last[-1] in MARKS else self._always
