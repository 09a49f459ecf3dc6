"""A cap on characters of one kind in a row: the machinery of the word rule and the whitespace rule.

A kind is given by how a token's bytes split into its runs (`Runs`: the characters of each run in
order, None where one ends). The state is the length of the run the context ends with, capped at the
cap; every token that would take that run past the cap, or that holds a run too long by itself, is
banned. Each rule reads its state from a fixed number of last tokens, so plain and accelerated
decoding apply it alike, as part of the target distribution.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where a mask is built: `tokenswift --help` stays instant
    import torch

Runs = Callable[[bytes], list[int | None]]
WHITESPACE = frozenset(b" \t\n\r\x0b\x0c")  # ASCII's, one byte a character


class RunLengthRule:
    """Which tokens may come next, by the length of the run the text ends with (capped at `cap`)."""

    def __init__(self, vocabulary: Sequence[bytes], vocab_size: int, cap: int, runs: Runs, context_tokens: int) -> None:
        import torch

        self.cap = cap
        self.context_tokens = context_tokens
        pieces = list(vocabulary[:vocab_size]) + [b""] * max(vocab_size - len(vocabulary), 0)
        split = [runs(p) for p in pieces]
        self._ends_run = [None in r for r in split]  # whether a token holds a run's end
        self._last_run = [r[-1] or 0 for r in split]  # the characters of the run it leaves open
        self._first_run = torch.tensor([r[0] or 0 for r in split])  # [vocab]: what it adds to the open run
        self._always = torch.tensor([max((n or 0 for n in r[1:]), default=0) > cap for r in split])  # [vocab]
        self._banned: dict[int, torch.Tensor] = {}

    def banned(self, context: Sequence[int]) -> torch.Tensor:
        """Bool `[vocab]`: the tokens that may not follow `context` (the path's last tokens)."""
        return self.banned_after(self.state(context))

    def state(self, context: Sequence[int]) -> int:
        """The characters of the run `context` ends with, at most the cap."""
        length = 0
        for token in reversed(context):
            inside = token < len(self._last_run)
            length += self._last_run[token] if inside else 0
            if length >= self.cap:
                return self.cap
            if inside and self._ends_run[token]:
                break
        return length

    def banned_after(self, state: int) -> torch.Tensor:
        """Bool `[vocab]`: the tokens that may not follow a run of `state` characters."""
        if state not in self._banned:
            self._banned[state] = self._always | (self._first_run > self.cap - state)
        return self._banned[state]
