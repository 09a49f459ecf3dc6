"""`tokenswift eval`: the quality of a text (a run's or any file) by position. See quality/report.py.

Thin: it finds the text, loads the model, calls `quality.report.evaluate_text` and prints a table (or JSON).
Nothing heavy is imported at module load, so `tokenswift --help` stays instant.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from tokenswift_cli.cli.errors import errors
from tokenswift_cli.cli.help import Command
from tokenswift_cli.cli.options import DeviceOpt, DTypeOpt, JsonOpt, ModelOpt, RunsDirOpt, WeightsOpt

SourceArg = Annotated[
    str,
    typer.Argument(
        help="A text file, or a run (run-042, 42 or its folder): its text.txt, with prefix.txt as context.",
        show_default=False,
    ),
]


def register(app: typer.Typer) -> None:
    """Add `eval` to the main app."""
    app.command("eval", cls=Command, epilog="Example: tokenswift eval run-003 --bucket 4096")(eval_command)


def eval_command(
    source: SourceArg,
    model: ModelOpt = "default",
    dtype: DTypeOpt = "auto",
    weights: WeightsOpt = "dense",
    device: DeviceOpt = "cpu",
    prefix: Annotated[
        Path | None, typer.Option("--prefix", "-p", help="Context before the text (not scored).", show_default=False)
    ] = None,
    bucket: Annotated[int, typer.Option(min=1, help="Tokens per row of the table by position.")] = 2048,
    distinct_window: Annotated[int, typer.Option(min=4, help="Tokens per Distinct-n window.")] = 10_000,
    window: Annotated[int, typer.Option(min=2, help="Sliding window of the perplexity (tokens).")] = 2048,
    stride: Annotated[int, typer.Option(min=1, help="Step of the sliding window (<= window).")] = 1024,
    full_context: Annotated[
        bool, typer.Option("--full-context", help="Score each token with the whole text before it, at its position.")
    ] = False,
    rope_scaling: Annotated[
        str, typer.Option("--rope-scaling", help="auto, yarn or none: the model's rope for --full-context.")
    ] = "auto",
    rope_factor: Annotated[float | None, typer.Option("--rope-factor", help="YaRN factor (default: sized).")] = None,
    context_window: Annotated[
        str,
        typer.Option("--context-window", help="none or a size such as 4092: the engine's window, for --full-context."),
    ] = "none",
    sinks: Annotated[int, typer.Option("--sinks", min=1, help="Sink tokens of --context-window.")] = 4,
    perplexity: Annotated[bool, typer.Option("--perplexity/--no-perplexity", help="Load the model for NLL.")] = True,
    runs_dir: RunsDirOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Measure a text: perplexity by position, Distinct-1..4, repeated sentences, compression ratio."""
    with errors():
        from tokenswift_cli.config import ContextWindow, ModelSpec
        from tokenswift_cli.parsing import parse_tokens
        from tokenswift_cli.quality.report import EvalWindows, evaluate_text, markdown

        text, context = _find_text(source, prefix, runs_dir)
        spec = ModelSpec(name=model, dtype=dtype, device=device, weights=weights,  # type: ignore[arg-type]
                         rope_scaling=rope_scaling, rope_factor=rope_factor)  # type: ignore[arg-type]  # fmt: skip
        chosen = (
            None if context_window.strip().lower() == "none" else ContextWindow(parse_tokens(context_window), sinks)
        )
        windows = EvalWindows(bucket, distinct_window, None if full_context else window, min(stride, window), chosen)
        head, report = evaluate_text(text, spec, context=context, windows=windows, perplexity=perplexity)
    if json_out:
        typer.echo(json.dumps({"source": source, **head, **report.to_dict()}, indent=1))
        return
    typer.echo(" ".join(f"{k}={v}" for k, v in {"source": source, **head}.items()))
    typer.echo(markdown(report))


def _find_text(source: str, prefix: Path | None, runs_dir: Path | None) -> tuple[str, str]:
    """(text, context before it) of a text file or a run."""
    from tokenswift_cli.config import ConfigError
    from tokenswift_cli.runs import store as runs

    path = Path(source).expanduser()
    context = prefix.read_text(encoding="utf-8") if prefix is not None else ""
    if path.is_file():
        return path.read_text(encoding="utf-8"), context
    if not path.exists() and (path.suffix or "/" in source):  # a file's name, not a run's
        raise ConfigError(f"no such file: {source}")
    run = runs.resolve_run(runs.runs_root(runs_dir), source)
    if prefix is None and (run / runs.PREFIX).is_file():
        context = (run / runs.PREFIX).read_text(encoding="utf-8")
    return (run / runs.TEXT).read_text(encoding="utf-8"), context
