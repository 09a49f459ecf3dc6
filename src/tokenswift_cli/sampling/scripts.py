"""The scripts filter: the sampler never draws a token that would put a character of another script in the text.

A small model that wanders off an English text into full-width letters or CJK (seen at 24K tokens
of the embedded model's runs) seldom comes back for thousands of tokens. `--scripts` keeps the
text in the scripts of its prefix (or the ones named). Byte-level vocabularies spell such a
character over several tokens (full-width "Ｈ" is EF BC + A8), so the filter works on bytes: a
token is allowed when the bytes it adds, after the incomplete character the text may end with,
decode to allowed characters and at most the start of one more that can still become an allowed
character. It depends only on the path's last tokens, so plain and accelerated decoding apply it
alike, as part of the target distribution.

Grammar engines (xgrammar, llguidance, outlines) do this for any grammar, with a matcher whose
state follows each path; a character class needs only the last incomplete character, kept here.
"""

from __future__ import annotations

import bisect
import codecs
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported where a mask is built: `tokenswift --help` stays instant
    import torch

# Always allowed under a filter: ASCII (letters included: most texts in any script quote some),
# Latin-1's symbols, and the general punctuation, currency, letterlike and number-form blocks.
COMMON: tuple[tuple[int, int], ...] = (
    (0x09, 0x0A), (0x0D, 0x0D), (0x20, 0x7E), (0xA0, 0xBF), (0xD7, 0xD7), (0xF7, 0xF7),
    (0x2000, 0x206F), (0x20A0, 0x20CF), (0x2100, 0x218F),
)  # fmt: skip

SCRIPTS: dict[str, tuple[tuple[int, int], ...]] = {
    "latin": ((0xC0, 0xD6), (0xD8, 0xF6), (0xF8, 0x24F), (0x1E00, 0x1EFF)),
    "greek": ((0x370, 0x3FF), (0x1F00, 0x1FFF)),
    "cyrillic": ((0x400, 0x52F),),
    "armenian": ((0x530, 0x58F),),
    "hebrew": ((0x590, 0x5FF),),
    "arabic": ((0x600, 0x6FF), (0x750, 0x77F)),
    "devanagari": ((0x900, 0x97F),),
    "thai": ((0xE00, 0xE7F),),
    "georgian": ((0x10A0, 0x10FF),),
    "hangul": ((0x1100, 0x11FF), (0x3130, 0x318F), (0xAC00, 0xD7AF)),
    # Han, kana, CJK punctuation and the full-width forms that CJK texts use.
    "cjk": ((0x3000, 0x30FF), (0x31F0, 0x31FF), (0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xF900, 0xFAFF), (0xFF00, 0xFFEF)),
    "emoji": ((0x2600, 0x27BF), (0xFE0F, 0xFE0F), (0x1F300, 0x1FAFF)),
}


def parse_scripts(value: str) -> tuple[str, ...]:
    """`--scripts`: "any" (no filter), "auto" (the prefix's scripts) or names such as "latin,greek".

    The names are checked by `SamplingConfig`.
    """
    value = value.strip().lower()
    if value in ("any", "auto"):
        return () if value == "any" else ("auto",)
    return tuple(sorted({name.strip() for name in value.split(",") if name.strip()})) or (value,)


def scripts_of(text: str) -> tuple[str, ...]:
    """The scripts whose letters appear in `text`; Latin always (the ASCII letters are common to all)."""
    found = {"latin"}
    for char in set(text):
        code = ord(char)
        found.update(name for name, ranges in SCRIPTS.items() if any(lo <= code <= hi for lo, hi in ranges))
    return tuple(sorted(found))


def token_bytes(tokenizer: Any) -> list[bytes]:
    """The bytes each token id adds to the text, for byte-level BPE, byte-fallback and plain vocabularies."""
    size = len(tokenizer)
    pieces = tokenizer.convert_ids_to_tokens(list(range(size)))
    decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
    if type(decoder).__name__ == "ByteLevel":
        from transformers.convert_slow_tokenizer import bytes_to_unicode

        to_byte = {char: byte for byte, char in bytes_to_unicode().items()}
        special = set(getattr(tokenizer, "all_special_tokens", ()))
        plain = [piece in special or any(c not in to_byte for c in piece) for piece in pieces]
        return [p.encode() if text else bytes(to_byte[c] for c in p) for p, text in zip(pieces, plain, strict=True)]
    result = []
    for index, piece in enumerate(pieces):
        if isinstance(piece, str) and len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            result.append(bytes([int(piece[3:5], 16)]))  # sentencepiece's byte fallback
        elif isinstance(piece, str) and "\u2581" in piece:
            result.append(piece.replace("\u2581", " ").encode())
        else:
            result.append(tokenizer.decode([index]).encode())
    return result


def _merged(ranges: Iterable[tuple[int, int]]) -> tuple[list[int], list[int]]:
    starts, ends = [], []
    for lo, hi in sorted(ranges):
        if starts and lo <= ends[-1] + 1:
            ends[-1] = max(ends[-1], hi)
        else:
            starts.append(lo)
            ends.append(hi)
    return starts, ends


def _sequence_length(lead: int) -> int:
    """Bytes of the UTF-8 sequence that starts with `lead`; 0 for a byte that cannot start one."""
    if lead < 0x80:
        return 1
    return 2 if 0xC2 <= lead <= 0xDF else 3 if 0xE0 <= lead <= 0xEF else 4 if 0xF0 <= lead <= 0xF4 else 0


def pending_bytes(tail: bytes) -> bytes:
    """The incomplete character `tail` (the text's last bytes) ends with, or b""."""
    for back in range(1, min(3, len(tail)) + 1):
        byte = tail[-back]
        if byte < 0x80 or byte >= 0xC0:  # an ASCII byte or the lead of a sequence
            return tail[-back:] if byte >= 0xC0 and _sequence_length(byte) > back else b""
    return b""


class Alphabet:
    """The characters of some scripts (and the common ones)."""

    def __init__(self, scripts: Sequence[str]) -> None:
        self.scripts = tuple(scripts)
        self._starts, self._ends = _merged([*COMMON, *(r for name in self.scripts for r in SCRIPTS[name])])

    def allows(self, code: int) -> bool:
        index = bisect.bisect_right(self._starts, code) - 1
        return index >= 0 and code <= self._ends[index]

    def can_complete(self, partial: bytes) -> bool:
        """Whether some allowed character starts with the incomplete UTF-8 sequence `partial`."""
        length = _sequence_length(partial[0])
        if any(not 0x80 <= b <= 0xBF for b in partial[1:]):
            return False
        value = partial[0] & (0x7F >> length)
        for byte in partial[1:]:
            value = value << 6 | byte & 0x3F
        missing = 6 * (length - len(partial))
        smallest = {2: 0x80, 3: 0x800, 4: 0x10000}[length]  # shorter forms would be overlong
        lo, hi = max(value << missing, smallest), min(value << missing | (1 << missing) - 1, 0x10FFFF)
        index = bisect.bisect_right(self._starts, hi) - 1  # the last allowed range starting at or below hi
        return lo <= hi and index >= 0 and self._ends[index] >= lo

    def foreign_share(self, text: str) -> float:
        """The share of `text`'s non-space characters that it does not allow."""
        chars = [ord(c) for c in text if not c.isspace()]
        return sum(not self.allows(c) for c in chars) / len(chars) if chars else 0.0


class ScriptFilter:
    """Which tokens may come next, given the incomplete character the text ends with (one mask per such state)."""

    def __init__(self, scripts: Sequence[str], vocabulary: Sequence[bytes], vocab_size: int) -> None:
        self.scripts = tuple(scripts)
        self.alphabet = Alphabet(self.scripts)
        self._vocabulary = list(vocabulary)
        self._vocab_size = vocab_size
        self._banned: dict[bytes, torch.Tensor] = {}

    def _token_allowed(self, pending: bytes, piece: bytes) -> bool:
        decoder = codecs.getincrementaldecoder("utf-8")()
        try:
            text = decoder.decode(pending + piece, final=False)
        except UnicodeDecodeError:
            return False
        if not all(self.alphabet.allows(ord(char)) for char in text):
            return False
        rest = decoder.getstate()[0]
        return not rest or self.alphabet.can_complete(rest)

    def banned_after(self, pending: bytes) -> torch.Tensor:
        """Bool `[vocab]`: the tokens that may not follow a text ending with the incomplete character `pending`."""
        if pending not in self._banned:
            import torch

            banned = torch.ones(self._vocab_size, dtype=torch.bool)
            pieces = self._vocabulary[: self._vocab_size]
            allowed = [i for i, piece in enumerate(pieces) if self._token_allowed(pending, piece)]
            banned[allowed] = False
            if not allowed:  # a text ending in a character of no allowed script: leave the choice free
                banned[:] = False
            self._banned[pending] = banned
        return self._banned[pending]

    def banned(self, context: Sequence[int]) -> torch.Tensor:
        """Bool `[vocab]`: the tokens that may not follow `context` (the path's last tokens)."""
        return self.banned_after(self.state(context))

    def state(self, context: Sequence[int]) -> bytes:
        """What the mask after `context` depends on: the incomplete character its last tokens end with."""
        return pending_bytes(b"".join(self._vocabulary[t] if t < len(self._vocabulary) else b"" for t in context[-4:]))
