"""`tokenswift runs`: list the runs, show one, remove some. Thin: runs/store.py reads the run folders."""

from __future__ import annotations

import json
import sys
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any

import typer

from tokenswift_cli.cli.errors import errors
from tokenswift_cli.cli.help import Command, Group
from tokenswift_cli.cli.options import JsonOpt, RunArg, RunsDirOpt

if TYPE_CHECKING:
    from tokenswift_cli.runs.store import RunInfo

runs_app = typer.Typer(
    cls=Group,
    help="List runs, show one, remove some.\n\nExample: tokenswift runs show run-003 --json",
    pretty_exceptions_show_locals=False,
)
RunsArg = Annotated[
    list[str],
    typer.Argument(
        help="Runs to delete: run-042, 42 or a run folder's path; several at once.", metavar="RUN...",
        show_default=False,
    ),
]  # fmt: skip
YesOpt = Annotated[
    bool, typer.Option("--yes", "-y", help="Delete without asking (needed when stdin is not a terminal).")
]
SHORT = 40  # characters of a prompt, a prefix or an --out path in the listing
LISTED = ("run", "started", "state", "resume", "progress", "tok/s", "alpha", "model", "prompt or prefix", "--out")


def register(app: typer.Typer) -> None:
    """Add `runs` and its subcommands to the main app."""
    app.add_typer(runs_app, name="runs")


@runs_app.callback(invoke_without_command=True)
def runs_list(ctx: typer.Context, runs_dir: RunsDirOpt = None, as_json: JsonOpt = False) -> None:
    """List runs: id, start, state, progress, speed, drafts, model, prompt or prefix, --out."""
    if ctx.invoked_subcommand is not None:
        return
    from rich.console import Console

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
    rows: list[tuple[str, ...]] = []
    for info in infos:
        # Any stopped run whose files allow it resumes, a failed one too; done and running ones say nothing.
        resume = ("yes" if info.resumable else "no") if info.state in ("interrupted", "failed", "incomplete") else ""
        progress = f"{info.generated:,}/{info.target:,}" if info.state != "incomplete" else "-"
        drafts = info.drafts
        alpha = "" if drafts is None or not drafts.steps else "off" if drafts.off else f"{info.alpha:.2f}"
        rows.append((
            info.id, started(info.created), info.state, resume, progress, f"{info.tokens_per_second:.1f}", alpha,
            info.model, shortened(info.subject), shortened(info.out or "", tail=True),
        ))  # fmt: skip
    # Not a terminal: as wide as the rows need (a pipe's reader wants whole cells).
    console = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 240)
    console.print(_table(rows, console.width))
    for info in infos:
        if info.state == "incomplete":
            typer.echo(f"{info.id}: {info.error}")


@runs_app.command("show", cls=Command, epilog="Example: tokenswift runs show run-003 --json")
def runs_show(ctx: typer.Context, run: RunArg, runs_dir: RunsDirOpt = None, as_json: JsonOpt = False) -> None:
    """Show one run's settings, statistics and what is on disk (last checkpoint, tokens, bytes)."""
    from tokenswift_cli.runs import store as runs
    from tokenswift_cli.runs.drafts import DraftFigures, describe

    runs_dir, as_json = _or_group(ctx, "runs_dir", runs_dir), _or_group(ctx, "as_json", as_json)

    with errors():
        report = runs.run_report(runs.resolve_run(runs.runs_root(runs_dir), run))
    if as_json:
        typer.echo(json.dumps(report, indent=1))
        return
    resume = f"yes: tokenswift resume {report['id']}" if report["resumable"] else f"no, {report['resume_blocker']}"
    head = {
        "run": f"{report['id']} ({report['state']})" + (f": {report['error']}" if report["error"] else ""),
        "folder": report["path"],
        "on disk": _on_disk(report),
        "resume": resume,
    }
    if report["settings"] is None:  # incomplete: no settings to show
        for key, value in head.items():
            typer.echo(f"{key:>9}  {value}")
        return
    stats, cfg = report["statistics"], report["settings"]["run_config"]
    lines = {
        **head,
        "model": f"{report['settings']['model']['label']} ({report['settings']['model']['spec']['name']})",
        "heads": report["settings"]["heads"]["path"] or "none",
        "mode": cfg["mode"],
        "progress": f"{stats['generated_tokens']:,}/{stats['target_tokens']:,} tokens",
        "speed": f"{stats['tokens_per_second']:.2f} tok/s over {stats['seconds']:.1f} s",
        "drafts": describe(DraftFigures(**stats["drafts"]), sep=", "),
        "sampling": ", ".join(f"{k}={v}" for k, v in cfg["sampling"].items() if v not in (None, ())),
    }
    for key, value in lines.items():
        typer.echo(f"{key:>9}  {value}")


def _or_group(ctx: typer.Context, name: str, value: Any) -> Any:
    """A subcommand's option, else the group's: `tokenswift runs --runs-dir D show run-001` means D too."""
    if value or ctx.parent is None:
        return value
    return ctx.parent.params.get(name, value)


def _on_disk(report: dict[str, Any]) -> str:
    """The last checkpoint (tokens, bytes) and the text, or why a resume starts from the prefix."""
    disk, saved = report["disk"], report["checkpoint"]
    text = f"text.txt {disk['text_bytes']:,} bytes" if disk["text_bytes"] is not None else "no text.txt"
    if saved is not None:
        after = (disk["text_bytes"] or 0) - saved["text_bytes"]
        return (
            f"checkpoint {saved['seq']} ({saved['written_at'].replace('T', ' ')[:19]}): {saved['tokens']:,} tokens, "
            f"{saved['text_bytes']:,} bytes of text, {saved['files']} files of {saved['bytes']:,} bytes; {text}"
            + (f" ({after:,} bytes after the checkpoint, written again on resume)" if after > 0 else "")
        )
    if disk["checkpoint_error"]:
        return f"{disk['checkpoint_error']}; {text}"
    if report["settings"] is None:
        return ", ".join(disk["files"]) or "nothing"
    tokens = report["settings"]["prefix"]["tokens"]
    return f"no checkpoint yet: a resume starts again from the {tokens:,}-token prefix; {text}"


@runs_app.command("rm", cls=Command, epilog="Example: tokenswift runs rm run-003 run-004 (--yes: without asking)")
def runs_rm(ctx: typer.Context, runs: RunsArg, yes: YesOpt = False, runs_dir: RunsDirOpt = None) -> None:
    """Delete runs (their checkpoints and text included), after asking."""
    from tokenswift_cli.config import ConfigError
    from tokenswift_cli.runs import store

    runs_dir = _or_group(ctx, "runs_dir", runs_dir)

    with errors():
        root = store.runs_root(runs_dir)
        # Every name is checked before anything is deleted: a typo deletes nothing.
        infos = [store.run_info(path) for path in dict.fromkeys(store.resolve_run(root, name) for name in runs)]
        for info in infos:
            if info.state == "running":
                raise store.RunError(f"{info.id} is running; stop it first")
        if not yes:
            if not stdin_is_terminal():  # `echo n |`, a script: nobody can answer, so nothing is deleted
                raise ConfigError("runs rm asks before deleting and stdin is not a terminal: add --yes to delete")
            for info in infos:
                typer.echo(f"  {_described(info)}", err=True)
            plural = f"these {len(infos)} runs" if len(infos) > 1 else "this run"
            if not typer.confirm(f"Delete {plural}, checkpoints and text included?", default=False, err=True):
                typer.echo("nothing deleted", err=True)
                raise typer.Exit(1)
        for info in infos:
            typer.echo(f"removed {store.remove_run(root, str(info.path))}", err=True)


def stdin_is_terminal() -> bool:
    """Whether someone can answer a question on stdin (the tests stand in for a terminal here)."""
    return sys.stdin.isatty()


def _described(info: RunInfo) -> str:
    """One line that tells a run from the others: id, state, tokens, start, prompt or prefix."""
    tokens = f"{info.generated:,}/{info.target:,} tokens" if info.state != "incomplete" else "incomplete"
    return f"{info.id}  {info.state}  {tokens}  {started(info.created)}  {shortened(info.subject)}"


def _table(rows: list[tuple[str, ...]], width: int) -> Any:
    """One line per run: the figures keep their width; in a narrow terminal the model, the prompt and
    --out give way (cut short with an ellipsis), the longest first, rather than wrap."""
    from rich.table import Table

    widest = [max(len(column), *(len(row[index]) for row in rows)) for index, column in enumerate(LISTED)]
    flexible = [index for index, column in enumerate(LISTED) if column in ("model", "prompt or prefix", "--out")]
    room = width - sum(w for index, w in enumerate(widest) if index not in flexible) - (len(LISTED) - 1)
    while sum(widest[i] for i in flexible) > room and max(widest[i] for i in flexible) > 6:
        longest = max(flexible, key=lambda i: widest[i])
        widest[longest] -= 1
    table = Table(box=None, header_style="bold", pad_edge=False, padding=(0, 1, 0, 0))
    for index, column in enumerate(LISTED):
        table.add_column(
            column, justify="right" if column in ("progress", "tok/s", "alpha") else "left", no_wrap=True,
            overflow="ellipsis", width=widest[index],
        )  # fmt: skip
    for row in rows:
        table.add_row(*row)
    return table


def started(created: str, now: datetime | None = None) -> str:
    """A run's start (recorded in UTC) in the local time zone, to the minute; the year where it is not this one."""
    try:
        local = datetime.fromisoformat(created).astimezone()
    except ValueError:  # a hand-edited file
        return created.replace("T", " ")[:16]
    this_year = (now or datetime.now().astimezone()).year == local.year
    return local.strftime("%m-%d %H:%M" if this_year else "%Y-%m-%d %H:%M")


def shortened(text: str, length: int = SHORT, *, tail: bool = False) -> str:
    """`text` on one line, at most `length` characters: its start (a path: its end) and an ellipsis."""
    line = " ".join(text.split())
    if len(line) <= length:
        return line
    return "…" + line[-(length - 1) :] if tail else line[: length - 1] + "…"
