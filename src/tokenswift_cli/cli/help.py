"""How the commands' help reads: on/off flags without a value placeholder, paragraphs that wrap whole.

Typer's rich help prints a type beside every option, `<bool>` for flags too, which reads as if
`--quiet true` were the way to spell it (it fails). Every command and group is built with these
classes (`cls=`), which give flags an empty placeholder, the help option's included.

Typer also keeps the line breaks of a docstring: a paragraph wrapped at the source's width breaks off
mid-sentence in a terminal of another width. These classes join each paragraph into one line, which
the terminal then wraps.
"""

from __future__ import annotations

from typing import Any

from typer.core import TyperCommand, TyperGroup


def _plain_flags(params: list[Any]) -> list[Any]:
    for param in params:
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""
    return params


def reflowed(text: str | None) -> str | None:
    """`text` with the lines of each paragraph joined; paragraphs (blank lines) and click's no-rewrap
    paragraphs (marked `\\b`) stay as they are."""
    if text is None:
        return None
    paragraphs = text.split("\n\n")
    return "\n\n".join(p if p.startswith("\b") else " ".join(p.split()) for p in paragraphs)


class Command(TyperCommand):
    """A command whose flags show no placeholder in its help, and whose paragraphs wrap whole."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.help = reflowed(self.help)

    def get_params(self, ctx: Any) -> list[Any]:
        return _plain_flags(super().get_params(ctx))


class Group(TyperGroup):
    """A group of commands whose flags show no placeholder in its help, and whose paragraphs wrap whole."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.help = reflowed(self.help)

    def get_params(self, ctx: Any) -> list[Any]:
        return _plain_flags(super().get_params(ctx))
