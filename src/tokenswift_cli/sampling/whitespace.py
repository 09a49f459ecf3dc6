"""The whitespace rule: no more than `--max-spaces` whitespace characters in a row.

One way the embedded model's long answers fail is a poem of short lines laid out in blank space:
lines of ten to eighty spaces between the lines of text, hundreds of whitespace characters in a row
(docs/quality.md: request seed 5, 19 of 199 stretches looping on them). Public-domain books never hold
more than 13 in a row (a bibliography's indented columns; Paradise Lost 7, Othello 7), and code
indented sixteen deep after a line end stays within 17. The rule bans every token that would take the
whitespace the text ends with past the cap, so the blank lines are cut where they start.

Whitespace is ASCII's: spaces, tabs, line ends, vertical tabs and form feeds, one byte a character;
any other byte ends a run. The state is the length of the run the context ends with, which its last
cap + 1 tokens settle (each token holds at least one byte), so plain and accelerated decoding apply
the rule alike, as part of the target distribution.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from tokenswift_cli.sampling.run_length import WHITESPACE, RunLengthRule


def whitespace_runs(piece: bytes) -> list[int | None]:
    """The whitespace characters of each run in `piece`, in order, with None where a run ends (any other
    byte): b" \\n a  " -> [3, None, 2]."""
    runs: list[int | None] = [0]
    for byte in piece:
        if byte in WHITESPACE:
            runs[-1] = (runs[-1] or 0) + 1
        else:
            runs += [None, 0]
    return runs


def context_tokens(cap: int) -> int:
    """The last tokens that settle the state: each token holds at least one byte."""
    return cap + 1


def longest_run(text: str) -> int:
    """The most whitespace characters in a row anywhere in `text`, as the rule counts them."""
    return max((len(m.group()) for m in re.finditer(r"[ \t\n\r\x0b\x0c]+", text)), default=0)


class WhitespaceRule(RunLengthRule):
    """Which tokens may come next, by the whitespace the text ends with (capped at `cap`)."""

    def __init__(self, vocabulary: Sequence[bytes], vocab_size: int, cap: int) -> None:
        super().__init__(vocabulary, vocab_size, cap, whitespace_runs, context_tokens(cap))
