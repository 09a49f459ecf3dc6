"""`tokenswift eval`: the quality of a text (a run's or any file) by position. See quality/report.py.

Thin: it finds the text, loads the model, calls `quality.report.evaluate_text` and prints a table (or JSON).
Nothing heavy is imported at module load, so `tokenswift --help` stays instant.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from tokenswift_cli.cli.errors import errors, hidden_cache_rename
from tokenswift_cli.cli.help import Command
from tokenswift_cli.cli.options import CpuDeviceOpt, DTypeOpt, JsonOpt, JudgeWeightsOpt, ModelOpt, RunsDirOpt

SourceArg = Annotated[
    list[str],
    typer.Argument(
        help="A text file, or a run (run-042, 42 or its folder): its text.txt, with prefix.txt as context. "
        "Several: one table, a line per source and one overall.",
        metavar="SOURCE",
        show_default=False,
    ),
]


def register(app: typer.Typer) -> None:
    """Add `eval` to the main app."""
    epilog = "Example: tokenswift eval run-003 --bucket 4096 (several: tokenswift eval run-001 run-002 run-003)"
    app.command("eval", cls=Command, epilog=epilog)(eval_command)


def eval_command(
    sources: SourceArg,
    model: ModelOpt = "default",
    dtype: DTypeOpt = "auto",
    weights: JudgeWeightsOpt = "dense",
    device: CpuDeviceOpt = "cpu",
    prefix: Annotated[
        Path | None, typer.Option("--prefix", "-p", help="Context before the text (not scored).", show_default=False)
    ] = None,
    bucket: Annotated[int, typer.Option(min=1, help="Tokens per row of the table by position.")] = 2048,
    distinct_window: Annotated[int, typer.Option(min=4, help="Tokens per Distinct-n window.")] = 10_000,
    window: Annotated[int, typer.Option(min=2, help="Sliding window of the perplexity (tokens).")] = 2048,
    stride: Annotated[int, typer.Option(min=1, help="Step of the sliding window (< window).")] = 1024,
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
    keep: Annotated[
        int, typer.Option("--keep", "--sinks", min=1, help="First tokens kept in view under --context-window.")
    ] = 4,
    sample: Annotated[
        int | None,
        typer.Option(
            min=1, help="Judge only the first N tokens of each bucket (faster on long texts).", show_default=False
        ),
    ] = None,
    perplexity: Annotated[bool, typer.Option("--perplexity/--no-perplexity", help="Load the model for NLL.")] = True,
    runs_dir: RunsDirOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Measure a text: perplexity by position, Distinct-1..4, repeated sentences, compression ratio (several
    texts: one line each, with a run's recorded speed, and one overall)."""
    with errors():
        from tokenswift_cli.config import ConfigError, ContextWindow, ModelSpec
        from tokenswift_cli.parsing import parse_tokens
        from tokenswift_cli.quality.notes import caption, report_notes, summary_notes, written_tokens
        from tokenswift_cli.quality.report import EvalWindows, evaluate_text, markdown
        from tokenswift_cli.quality.summary import overall, row, run_speed, summary_markdown

        spec = ModelSpec(name=model, dtype=dtype, device=device, weights=weights,  # type: ignore[arg-type]
                         rope_scaling=rope_scaling, rope_factor=rope_factor)  # type: ignore[arg-type]  # fmt: skip
        chosen = None if context_window.strip().lower() == "none" else ContextWindow(parse_tokens(context_window), keep)
        if sample is not None and full_context:
            raise ConfigError("--sample judges with the sliding window: leave out --full-context")
        windows = EvalWindows(
            bucket, distinct_window, None if full_context else window, min(stride, window - 1), chosen, sample
        )
        found = [(source, *_find_text(source, prefix, runs_dir)) for source in sources]
        with hidden_cache_rename():
            reports = [
                (source, run, written_tokens(run, text),
                 *evaluate_text(text, spec, context=context, windows=windows, perplexity=perplexity))
                for source, text, context, run in found
            ]  # fmt: skip
    if len(reports) == 1:
        source, _, written, head, report = reports[0]
        if json_out:
            typer.echo(json.dumps({"source": source, **head, "written_tokens": written, **report.to_dict()}, indent=1))
            return
        typer.echo("\n".join([*caption(source, head, report, windows, written), "", markdown(report), ""]))
        typer.echo("\n".join(report_notes(report)))
        return
    rows = [row(source, report, run_speed(run), written) for source, run, written, _, report in reports]
    if json_out:
        runs = [{"source": s, **head, **report.to_dict(), "summary": r.to_dict()}
                for (s, _, _, head, report), r in zip(reports, rows, strict=True)]  # fmt: skip
        typer.echo(json.dumps({"runs": runs, "overall": overall(rows).to_dict()}, indent=1))
        return
    typer.echo("\n".join([summary_markdown(rows), "", *summary_notes(rows)]))


def _find_text(source: str, prefix: Path | None, runs_dir: Path | None) -> tuple[str, str, Path | None]:
    """(text, context before it, the run's folder: None for a file) of a text file or a run."""
    from tokenswift_cli.config import ConfigError
    from tokenswift_cli.runs import store as runs

    path = Path(source).expanduser()
    context = prefix.read_text(encoding="utf-8") if prefix is not None else ""
    if path.is_file():
        return path.read_text(encoding="utf-8"), context, None
    if not path.exists() and (path.suffix or "/" in source):  # a file's name, not a run's
        raise ConfigError(f"no such file: {source}")
    run = runs.resolve_run(runs.runs_root(runs_dir), source)
    if prefix is None and (run / runs.PREFIX).is_file():
        context = (run / runs.PREFIX).read_text(encoding="utf-8")
    return (run / runs.TEXT).read_text(encoding="utf-8"), context, run
