"""Errors as one line: `error: ...` on stderr, exit code 2 for what a user can cause, 1 for a failure
during generation, never a traceback (TOKENSWIFT_DEBUG=1 shows it for internal errors)."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import typer

from tokenswift_cli.cli.help import Group
from tokenswift_cli.config import ConfigError


class OneLineErrors(Group):
    """Usage errors as one line `error: ...` (exit code 2) instead of a usage box."""

    def main(  # type: ignore[override]
        self, args: Sequence[str] | None = None, prog_name: str | None = None, complete_var: str | None = None,
        standalone_mode: bool = True, **extra: Any,
    ) -> Any:  # fmt: skip
        try:
            result = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
            code = result if isinstance(result, int) else 0
        except typer.TyperException as error:  # typer's own click: usage errors, bad parameters
            code = _report(error)
        except typer.Abort:
            typer.echo("error: aborted", err=True)
            code = 1
        if standalone_mode:
            sys.exit(code)
        return code


def _report(error: typer.TyperException) -> int:
    """Print a usage error as one line; the exit code."""
    message = error.format_message()
    # A group called without a command: its help, printed already (Rich) or in the message.
    # Matched by name, as Typer does: where the class lives depends on Typer's version.
    if type(error).__name__ == "NoArgsIsHelpError":
        if message.strip():
            typer.echo(message)
        return 0
    ctx = getattr(error, "ctx", None)
    where = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
    typer.echo(f"error: {message}{where}", err=True)
    return error.exit_code


def _user_error_types() -> tuple[type[BaseException], ...]:
    """Errors a user can cause; those of modules not imported yet cannot have been raised."""
    from tokenswift_cli.runs.checkpoint import CheckpointError
    from tokenswift_cli.runs.store import RunError

    found: list[type[BaseException]] = [ConfigError, CheckpointError, RunError, OSError]
    for module, name in (("model.loading", "ModelLoadError"), ("model.heads", "HeadsError")):
        loaded = sys.modules.get(f"tokenswift_cli.{module}")
        if loaded is not None:
            found.append(getattr(loaded, name))
    return tuple(found)


def _one_line(error: BaseException) -> str:
    if isinstance(error, OSError) and error.strerror:
        return f"{error.strerror}: {error.filename}" if error.filename else error.strerror
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


@contextlib.contextmanager
def errors() -> Iterator[None]:
    """One line on stderr and exit code 2 for user errors, 1 for failures during generation."""
    try:
        yield
    except (typer.Exit, typer.TyperException, KeyboardInterrupt):
        raise
    except Exception as error:
        session = sys.modules.get("tokenswift_cli.runs.session")
        if session is not None and isinstance(error, session.RunFailed):
            code = 1
        elif isinstance(error, _user_error_types()):
            code = 2
        elif os.environ.get("TOKENSWIFT_DEBUG"):
            raise
        else:
            typer.echo(f"error: internal error, {type(error).__name__}: {_one_line(error)} "
                       "(TOKENSWIFT_DEBUG=1 shows the traceback)", err=True)  # fmt: skip
            raise typer.Exit(1) from None
        typer.echo(f"error: {_one_line(error)}", err=True)
        raise typer.Exit(code) from None


# transformers 5.24 renamed forward()'s and generate()'s `past_key_values` to `cache` and warns at each
# call; the versions this package allows (5.17 on) do not all know `cache`, so our calls keep the old
# name and the commands hide that one notice (any other warning still shows).
_CACHE_RENAME = r"`past_key_values` is deprecated"


@contextlib.contextmanager
def hidden_cache_rename() -> Iterator[None]:
    """transformers' notice that `past_key_values` is now `cache`, hidden; every other warning shown."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_CACHE_RENAME, category=FutureWarning)
        yield
