"""`tokenswift resume`: continue a stopped run, with the command line's panel."""

from __future__ import annotations

import typer

from tokenswift_cli.cli.errors import errors
from tokenswift_cli.cli.help import Command
from tokenswift_cli.cli.invocation import program_name
from tokenswift_cli.cli.options import (
    DEFAULT_CHECKPOINT_EVERY,
    CheckpointEveryOpt,
    OutOpt,
    QuietOpt,
    RaiseTokensOpt,
    RunArg,
    RunsDirOpt,
    ThreadsOpt,
)
from tokenswift_cli.parsing import parse_tokens


def register(app: typer.Typer) -> None:
    """Add `resume` to the main app."""
    app.command("resume", cls=Command, epilog="Example: tokenswift resume run-042 >> book.txt")(resume)


def resume(
    run: RunArg,
    tokens: RaiseTokensOpt = None,
    out: OutOpt = None,
    checkpoint_every: CheckpointEveryOpt = DEFAULT_CHECKPOINT_EVERY,
    runs_dir: RunsDirOpt = None,
    quiet: QuietOpt = False,
    threads: ThreadsOpt = None,
) -> None:
    """Continue a stopped run to its target, exactly as if it had never stopped.

    Only the new text goes to stdout (and to --out, appended); the run's text.txt holds all of it.
    """
    with errors():
        target = parse_tokens(tokens) if tokens is not None else None
        from tokenswift_cli.cli.panel import make_renderer
        from tokenswift_cli.runs import runner

        runner.use_threads(threads)
        output = runner.Output(out=out, checkpoint_every=checkpoint_every, quiet=quiet, command=program_name())
        code = runner.resume(
            run=run, tokens=target, runs_dir=runs_dir, output=output, renderer=make_renderer(quiet=quiet)
        )
    raise typer.Exit(code)
