"""How the commands' help reads: on/off flags without a value placeholder.

Typer's rich help prints a type beside every option, `<bool>` for flags too, which reads as if
`--quiet true` were the way to spell it (it fails). Every command and group is built with these
classes (`cls=`), which give flags an empty placeholder, the help option's included.
"""

from __future__ import annotations

from typing import Any

from typer.core import TyperCommand, TyperGroup


def _plain_flags(params: list[Any]) -> list[Any]:
    for param in params:
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""
    return params


class Command(TyperCommand):
    """A command whose flags show no placeholder in its help."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _plain_flags(super().get_params(ctx))


class Group(TyperGroup):
    """A group of commands whose flags show no placeholder in its help."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _plain_flags(super().get_params(ctx))
