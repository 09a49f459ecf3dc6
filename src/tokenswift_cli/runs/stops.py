"""`--stop`: the text ends at the first occurrence of a stop string, the string included.

Text arrives in chunks (one per decoding step), so a stop string can start in one chunk and end in
the next: the matcher keeps the last few characters already written. Where the text ends depends on
the text alone, so plain decoding, TokenSwift and a resumed run end at the same character.
"""

from __future__ import annotations

from collections.abc import Sequence


class StopMatcher:
    """Cuts streamed text at the end of the first stop string; `tail` is the text written before."""

    def __init__(self, stops: Sequence[str], tail: str = "") -> None:
        self.stops = tuple(stops)
        self._keep = max((len(s) for s in self.stops), default=1) - 1
        self._tail = tail[len(tail) - self._keep :] if self._keep else ""
        self.ended = False  # nothing more is written once a stop string was

    def cut(self, chunk: str) -> tuple[str, bool]:
        """The part of `chunk` to write, and whether the text ends with it."""
        if self.ended:
            return "", True
        if not self.stops or not chunk:
            return chunk, False
        window = self._tail + chunk
        ends = [window.find(stop) + len(stop) for stop in self.stops if stop in window]
        if ends:  # a stop string wholly inside the tail was found when the tail arrived
            self.ended = True
            return chunk[: min(ends) - len(self._tail)], True
        self._tail = window[len(window) - self._keep :] if self._keep else ""
        return chunk, False
