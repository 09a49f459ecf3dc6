"""The capitals rule: no more than `--max-capitalised` capitalised words in a row.

The embedded model's long runs that survive the word rules still fall, now and then, into catalogs:
hundreds of words that all open with a capital, Title Case ("Ethnicreligion, Ethnicspirit,
Ethnicmusulman;") or all capitals ("HOLLAMSGOVERDON—WHATSAWAY—DETAILS—"), thousands of tokens long
(docs/quality.md: four runs of thirteen). Public-domain books never hold more than 17 such words in a row
(a bibliography's list of plays; Paradise Lost 12, Othello 8). Once the cap is reached the next word
must open with a small letter, a digit or a mark, so a catalog is cut as it starts, before the text
in view teaches the model the habit.

A word is a run of letters, digits, combining marks and apostrophes. It counts when it opens with a
capital and has two characters or more (initials, "I" and "A" do not count); it resets the count when
it opens with a small letter; one opening with a digit or a letter without case does neither. Bytes
that do not make a whole character inside one token count as a letter without case when they open a
character from U+00C0 below U+0800, as a mark (ending a word) when they open another, and not at all
when they continue one. The state is (words counted, capped at the cap; whether the text ends outside a word,
inside one, or right after a lone capital), read from the context's last `context_tokens` tokens, so
plain and accelerated decoding apply the rule alike, as part of the target distribution.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where a mask is built: `tokenswift --help` stays instant
    import torch

OUTSIDE, INSIDE, LONE_CAPITAL = 0, 1, 2  # where the text ends: between words, in a word, after a lone capital
_ENTRIES = (OUTSIDE, INSIDE, LONE_CAPITAL)


def context_tokens(cap: int) -> int:
    """The last tokens the state is read from: room for the cap's words with what may stand between them
    (a list of names with long numbers, one token a digit, spends ten tokens and more a word)."""
    return max(1024, 8 * cap + 8)


def characters(piece: bytes) -> list[str]:
    """`piece` as characters; a byte that makes no whole character inside it becomes "" (it continues one),
    a letter without case (U+05D0: it opens a two-byte character from U+00C0, mostly letters) or a mark
    (it opens one below U+00C0, Latin-1's signs, or a wider one)."""
    out: list[str] = []
    at = 0
    while at < len(piece):
        lead = piece[at]
        size = 1 if lead < 0xC0 else 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4
        try:
            out.append(piece[at : at + size].decode("utf-8"))
            at += size
        except UnicodeDecodeError:
            out.append("" if 0x80 <= lead < 0xC0 else "\u05d0" if 0xC2 < lead < 0xE0 else ",")
            at += 1
    return out


def _in_word(char: str) -> bool:
    return char.isalnum() or char in "'’" or unicodedata.category(char).startswith("M")


@dataclass(frozen=True)
class Passage:
    """What one token does from one entry: capitalised words before its first small-letter word (`lead`),
    the longest run of them after one (`inner`), whether it holds one (`resets`), those after its last one
    (`tail`), and where it leaves the text (`exit`)."""

    lead: int
    inner: int
    resets: bool
    tail: int
    exit: int


def passage(piece: bytes, entry: int) -> Passage:
    """How the count moves through `piece` when the text before it ends at `entry`."""
    where, lead, run, inner, resets = entry, 0, 0, 0, False
    for char in characters(piece):
        if char == "":
            continue
        if not _in_word(char):
            where = OUTSIDE
        elif where == LONE_CAPITAL:  # a capital with a second character: the word counts
            where, run = INSIDE, run + 1
            lead, inner = (lead + 1, inner) if not resets else (lead, max(inner, run))
        elif where == OUTSIDE:
            where = LONE_CAPITAL if char.isupper() else INSIDE
            if char.islower():
                resets, run = True, 0
    return Passage(lead=lead, inner=inner, resets=resets, tail=run if resets else lead, exit=where)


def longest_run(text: str) -> int:
    """The most capitalised words in a row anywhere in `text`, as the rule counts them."""
    whole = passage(text.encode(), OUTSIDE)
    return max(whole.lead, whole.inner)


class CapitalsRule:
    """Which tokens may come next, by the capitalised words the text ends with (capped at `cap`)."""

    def __init__(self, vocabulary: Sequence[bytes], vocab_size: int, cap: int) -> None:
        import torch

        self.cap = cap
        self.context_tokens = context_tokens(cap)
        pieces = list(vocabulary[:vocab_size]) + [b""] * max(vocab_size - len(vocabulary), 0)
        self._passages = [tuple(passage(p, entry) for entry in _ENTRIES) for p in pieces]
        # A token that resets whatever comes before leaves the same state from every entry: a reading starts there.
        self._anchor = [all(p.resets and p == ps[OUTSIDE] for p in ps) for ps in self._passages]
        self._lead = {e: torch.tensor([ps[e].lead for ps in self._passages]) for e in _ENTRIES}  # [vocab] each
        self._inner_too_long = {e: torch.tensor([ps[e].inner > cap for ps in self._passages]) for e in _ENTRIES}
        self._banned: dict[tuple[int, int], torch.Tensor] = {}

    def banned(self, context: Sequence[int]) -> torch.Tensor:
        """Bool `[vocab]`: the tokens that may not follow `context` (the path's last tokens)."""
        return self.banned_after(self.state(context))

    def state(self, context: Sequence[int]) -> tuple[int, int]:
        """(capitalised words in a row, at most the cap; where the text ends) after the last `context_tokens`
        tokens of `context`, read from its last token that resets the count (or from its first)."""
        tokens = context[-self.context_tokens :]
        start = len(tokens) - 1
        while start > 0 and not self._is_anchor(tokens[start]):
            start -= 1
        count, where = 0, OUTSIDE
        for token in tokens[max(start, 0) :]:
            if token < len(self._passages):  # an id past the vocabulary spells nothing
                step = self._passages[token][where]
                count = step.tail if step.resets else count + step.lead
                where = step.exit
        return min(count, self.cap), where

    def _is_anchor(self, token: int) -> bool:
        return token < len(self._anchor) and self._anchor[token]

    def banned_after(self, state: tuple[int, int]) -> torch.Tensor:
        """Bool `[vocab]`: the tokens that would take the count past the cap from `state`."""
        if state not in self._banned:
            count, where = state
            self._banned[state] = (self._lead[where] > self.cap - count) | self._inner_too_long[where]
        return self._banned[state]
