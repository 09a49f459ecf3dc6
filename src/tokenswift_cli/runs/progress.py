"""What a run reports as it goes: a `Progress` snapshot after each step, through a `Renderer`.

Presentation-free: the command line's panel and log lines (cli/panel.py) implement `Renderer`; a
run without one (a library call, or --quiet) reports to `QuietRenderer`, which says nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from tokenswift_cli.runs.drafts import DraftFigures


@dataclass(frozen=True)
class Progress:
    """A snapshot of a run after one step."""

    run_id: str
    generated: int
    target: int
    decode_seconds: float  # decoding time of the whole run, resumed parts included
    drafts: DraftFigures  # how it drafts, and what its drafts accepted (drafts.describe puts it in words)
    context: int  # tokens in the full cache
    kv_bytes: int
    last_checkpoint: int | None  # generated tokens at the last checkpoint


class Renderer(Protocol):
    takes_text: bool  # True: the runner hands the text to `text` instead of writing it to stdout

    def start(self, title: str) -> None: ...
    def update(self, progress: Progress) -> None: ...
    def checkpointed(self, generated: int) -> None: ...
    def note(self, message: str) -> None: ...
    def text(self, chunk: str) -> None: ...
    def close(self) -> None: ...


class QuietRenderer:
    """Nothing at all (--quiet, or a library call that passes no renderer)."""

    takes_text = False

    def start(self, title: str) -> None: ...
    def update(self, progress: Progress) -> None: ...
    def checkpointed(self, generated: int) -> None: ...
    def note(self, message: str) -> None: ...
    def text(self, chunk: str) -> None: ...
    def close(self) -> None: ...
