"""The word-length rule: no word longer than `--max-word` characters.

When the embedded model's long runs fail, the words run together (docs/quality.md): glued pairs,
which `--spacing` bans, but also hyphen chains ("Santiago-Colombia-Buenos-..."), capitals without end
("WISCENTPELACYSTENSATSECRET...") and codes ("mG8iUy14OwUZaByPzfAzp2hRe:2bjaladhi_@..."), hundreds of
characters without a space. Public-domain prose stays far below: Paradise Lost's longest word is 18
characters, Othello's dash-joined speeches reach 41. The rule bans every token that would take the
word the text ends with past the cap, so such a run is cut where it starts, before the text in view
teaches the model the habit.

A word is a run of characters below U+0800 other than ASCII whitespace: Latin, Greek, Cyrillic,
Hebrew, Arabic, digits and ASCII marks. Wider characters (CJK, Thai, dashes, curly quotes) end a word,
so scripts written without spaces are never capped. Counting is over the tokens' bytes (a character
is its first byte), so a character split across tokens counts once. The rule's state is the length of
the word the context ends with, which its last 4 x cap + 3 tokens settle, so plain and accelerated
decoding apply it alike, as part of the target distribution.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where a mask is built: `tokenswift --help` stays instant
    import torch

_WHITESPACE = frozenset(b" \t\n\r\x0b\x0c")


def word_runs(piece: bytes) -> list[int | None]:
    """The characters of each word run in `piece`, in order, with None where a run ends (a space or a wide
    character): b"ab cd" -> [2, None, 2]."""
    runs: list[int | None] = [0]
    for byte in piece:
        if byte in _WHITESPACE or byte >= 0xE0:  # a space, or the first byte of a character from U+0800
            runs += [None, 0]
        elif not 0x80 <= byte < 0xC0:  # continuation bytes belong to the character already counted
            runs[-1] = (runs[-1] or 0) + 1
    return runs


def context_tokens(cap: int) -> int:
    """The last tokens that settle the state: each token holds at least one byte, each character at most 4."""
    return 4 * cap + 3


class WordLengthRule:
    """Which tokens may come next, by the length of the word the text ends with (capped at `cap`)."""

    def __init__(self, vocabulary: Sequence[bytes], vocab_size: int, cap: int) -> None:
        import torch

        self.cap = cap
        pieces = list(vocabulary[:vocab_size]) + [b""] * max(vocab_size - len(vocabulary), 0)
        runs = [word_runs(p) for p in pieces]
        self._ends_word = [None in r for r in runs]  # whether a token holds a word's end
        self._last_run = [r[-1] or 0 for r in runs]  # the characters of the word it leaves open
        self._first_run = torch.tensor([r[0] or 0 for r in runs])  # [vocab]: what it adds to the open word
        self._always = torch.tensor([max((n or 0 for n in r[1:]), default=0) > cap for r in runs])  # [vocab]
        self._banned: dict[int, torch.Tensor] = {}
        self.context_tokens = context_tokens(cap)

    def banned(self, context: Sequence[int]) -> torch.Tensor:
        """Bool `[vocab]`: the tokens that may not follow `context` (the path's last tokens)."""
        return self.banned_after(self.state(context))

    def state(self, context: Sequence[int]) -> int:
        """The characters of the word `context` ends with, at most the cap."""
        length = 0
        for token in reversed(context):
            inside = token < len(self._last_run)
            length += self._last_run[token] if inside else 0
            if length >= self.cap:
                return self.cap
            if inside and self._ends_word[token]:
                break
        return length

    def banned_after(self, state: int) -> torch.Tensor:
        """Bool `[vocab]`: the tokens that may not follow a word of `state` characters."""
        if state not in self._banned:
            self._banned[state] = self._always | (self._first_run > self.cap - state)
        return self._banned[state]
