"""Incremental detokenization: text as tokens arrive, valid UTF-8 across token boundaries.

Each token is decoded together with a small look-back window of the tokens before it, never with the
whole text (Medusa's re-decoding is quadratic at 100K tokens; TokenSwift's isolated chunks split
multi-byte characters). A token that ends inside a multi-byte character decodes to a trailing
U+FFFD; up to `HOLD` trailing U+FFFD are held back until later tokens complete (or refute) them, so
the stream never writes a character that a later token would change.

The stream is processed token by token, so its output and its state depend only on the token
sequence, not on how the tokens were grouped into steps: a run resumed from a checkpoint writes the
same bytes as the same run uninterrupted.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

Decode = Callable[[list[int]], str]

REPLACEMENT = "\ufffd"
HOLD = 3  # an incomplete character spans at most 3 bytes, shown as at most 3 U+FFFD (byte fallback)
CONTEXT = 4  # tokens of look-back kept before the text still to write
MAX_WINDOW = 16  # past this many tokens the window is cut back to CONTEXT + HOLD tokens


@dataclass(frozen=True)
class StreamState:
    """What a checkpoint needs to continue the stream: the window and how much of its text is written."""

    window: tuple[int, ...]
    done: int  # characters of decode(window) already written (or part of the prefix)


class TextStream:
    """Turns committed tokens into text chunks whose concatenation is the decoded text."""

    def __init__(self, decode: Decode, context: Sequence[int] = (), *, state: StreamState | None = None) -> None:
        """`context`: the tokens before the first one pushed (the prefix), for leading-space rules."""
        self._decode = decode
        if state is None:
            window = list(context[-CONTEXT:])
            state = StreamState(tuple(window), len(decode(window)) if window else 0)
        self._window = list(state.window)
        self._done = state.done

    @property
    def state(self) -> StreamState:
        return StreamState(tuple(self._window), self._done)

    def push(self, tokens: Iterable[int]) -> str:
        """The new text that `tokens` complete (possibly empty)."""
        return "".join(self._push_one(int(token)) for token in tokens)

    def _push_one(self, token: int) -> str:
        self._window.append(token)
        text = self._decode(self._window)
        held = min(len(text) - len(text.rstrip(REPLACEMENT)), HOLD)
        stable = len(text) - held
        out = text[self._done : stable] if stable > self._done else ""
        self._done = max(self._done, stable)
        if len(self._window) > MAX_WINDOW:
            self._shrink(text)
        return out

    def _shrink(self, text: str) -> None:
        """Drop the oldest tokens when the rest decodes to the same tail of the text."""
        cut = len(self._window) - CONTEXT - HOLD  # the held text lies in the last HOLD tokens
        tail = self._decode(self._window[cut:])
        dropped = len(text) - len(tail)
        # The decoding of the kept tokens must not depend on the dropped ones (a character split at
        # the cut, a leading space rule), and the dropped text must be written already.
        if text.endswith(tail) and 0 <= dropped <= self._done:
            self._window = self._window[cut:]
            self._done -= dropped


def tokenizer_decoder(tokenizer: object) -> Decode:
    """`decode` for a `transformers` tokenizer: special tokens dropped, spaces left as the model wrote them."""

    def decode(ids: list[int]) -> str:
        return str(
            tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)  # type: ignore[attr-defined]
        )

    return decode
