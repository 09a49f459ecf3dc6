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

from tokenswift_cli.sampling.run_length import WHITESPACE, RunLengthRule


def word_runs(piece: bytes) -> list[int | None]:
    """The characters of each word run in `piece`, in order, with None where a run ends (a space or a wide
    character): b"ab cd" -> [2, None, 2]."""
    runs: list[int | None] = [0]
    for byte in piece:
        if byte in WHITESPACE or byte >= 0xE0:  # a space, or the first byte of a character from U+0800
            runs += [None, 0]
        elif not 0x80 <= byte < 0xC0:  # continuation bytes belong to the character already counted
            runs[-1] = (runs[-1] or 0) + 1
    return runs


def context_tokens(cap: int) -> int:
    """The last tokens that settle the state: each token holds at least one byte, each character at most 4."""
    return 4 * cap + 3


class WordLengthRule(RunLengthRule):
    """Which tokens may come next, by the length of the word the text ends with (capped at `cap`)."""

    def __init__(self, vocabulary: Sequence[bytes], vocab_size: int, cap: int) -> None:
        super().__init__(vocabulary, vocab_size, cap, word_runs, context_tokens(cap))
