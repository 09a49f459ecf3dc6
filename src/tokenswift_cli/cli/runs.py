"""`tokenswift runs`: list the runs, show one, remove one. Thin: runs.py reads the run folders."""

from __future__ import annotations

import json

import typer

from tokenswift_cli.cli.errors import errors
from tokenswift_cli.cli.help import Command, Group
from tokenswift_cli.cli.options import JsonOpt, RunArg, RunsDirOpt

runs_app = typer.Typer(
    cls=Group,
    help="List runs, show one, remove one.\n\nExample: tokenswift runs show run-003 --json",
    pretty_exceptions_show_locals=False,
)


def register(app: typer.Typer) -> None:
    """Add `runs` and its subcommands to the main app."""
    app.add_typer(runs_app, name="runs")


@runs_app.callback(invoke_without_command=True)
def runs_list(ctx: typer.Context, runs_dir: RunsDirOpt = None, as_json: JsonOpt = False) -> None:
    """List runs: id, state, model, progress, tokens/s, alpha."""
    if ctx.invoked_subcommand is not None:
        return
    from rich.console import Console
    from rich.table import Table

    from tokenswift_cli.runs import store as runs

    with errors():
        root = runs.runs_root(runs_dir)
        infos = runs.list_runs(root)
    if as_json:
        typer.echo(json.dumps([info.to_dict() for info in infos], indent=1))
        return
    if not infos:
        typer.echo(f"no runs in {root}")
        return
    table = Table(box=None, header_style="bold")
    for column in ("run", "state", "model", "progress", "tok/s", "alpha", "created"):
        table.add_column(column, justify="right" if column in ("progress", "tok/s", "alpha") else "left")
    for info in infos:
        table.add_row(
            info.id, info.state, info.model, f"{info.generated:,}/{info.target:,}",
            f"{info.tokens_per_second:.1f}", f"{info.alpha:.2f}", info.created.replace("T", " ")[:16],
        )  # fmt: skip
    Console(soft_wrap=True).print(table)


@runs_app.command("show", cls=Command, epilog="Example: tokenswift runs show run-003 --json")
def runs_show(run: RunArg, runs_dir: RunsDirOpt = None, as_json: JsonOpt = False) -> None:
    """Show one run's settings and statistics."""
    from tokenswift_cli.runs import store as runs

    with errors():
        report = runs.run_report(runs.resolve_run(runs.runs_root(runs_dir), run))
    if as_json:
        typer.echo(json.dumps(report, indent=1))
        return
    stats, cfg = report["statistics"], report["settings"]["run_config"]
    lines = {
        "run": f"{report['id']} ({report['state']})" + (f": {report['error']}" if report["error"] else ""),
        "folder": report["path"],
        "model": f"{report['settings']['model']['label']} ({report['settings']['model']['spec']['name']})",
        "heads": report["settings"]["heads"]["path"] or "none",
        "mode": cfg["mode"],
        "progress": f"{stats['generated_tokens']:,}/{stats['target_tokens']:,} tokens",
        "speed": f"{stats['tokens_per_second']:.2f} tok/s over {stats['seconds']:.1f} s",
        "drafts": f"alpha {stats['alpha']:.3f}, {stats['mean_accepted_length']:.2f} tokens/step",
        "sampling": ", ".join(f"{k}={v}" for k, v in cfg["sampling"].items() if v not in (None, ())),
    }
    for key, value in lines.items():
        typer.echo(f"{key:>9}  {value}")


@runs_app.command("rm", cls=Command, epilog="Example: tokenswift runs rm run-003")
def runs_rm(run: RunArg, runs_dir: RunsDirOpt = None) -> None:
    """Delete a run folder (checkpoints and text included)."""
    from tokenswift_cli.runs import store as runs

    with errors():
        path = runs.remove_run(runs.runs_root(runs_dir), run)
    typer.echo(f"removed {path}", err=True)
