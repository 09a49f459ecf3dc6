"""Commands for draft heads: `train-heads`, and `heads import | eval | info`.

Thin wrappers: they parse, call `train_run` / `heads`, and render progress and tables on stderr.
Nothing heavy is imported at module load, so `tokenswift --help` stays instant.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from tokenswift_cli.cli.errors import errors
from tokenswift_cli.cli.help import Command, Group
from tokenswift_cli.cli.options import ModelOpt

if TYPE_CHECKING:
    from tokenswift_cli.train.fit import Accuracy

TRAIN_EXAMPLE = "Example: tokenswift train-heads --minutes 60 --data novel.txt --out my-heads.safetensors"
IMPORT_EXAMPLE = (
    "Example: tokenswift heads import ./TokenSwift-llama3.1-8b --out llama3.1-8b.safetensors "
    "--model meta-llama/Llama-3.1-8B"
)
EVAL_EXAMPLE = "Example: tokenswift heads eval my-heads.safetensors --text novel.txt --tokens 8192"
INFO_EXAMPLE = "Example: tokenswift heads info my-heads.safetensors"

TextFiles = Annotated[
    list[Path] | None,
    typer.Option("--eval-text", help="Also measure accuracy on this text file (repeatable).", show_default=False),
]


def register(app: typer.Typer) -> None:
    """Add `train-heads` and the `heads` group to the main app."""
    app.command("train-heads", cls=Command, epilog=TRAIN_EXAMPLE)(train_heads_command)
    group = typer.Typer(
        cls=Group, help=f"Draft heads: import published ones, measure, inspect.\n\n{INFO_EXAMPLE}", no_args_is_help=True
    )
    group.command("import", cls=Command, epilog=IMPORT_EXAMPLE)(import_command)
    group.command("eval", cls=Command, epilog=EVAL_EXAMPLE)(eval_command)
    group.command("info", cls=Command, epilog=INFO_EXAMPLE)(info_command)
    app.add_typer(group, name="heads")


def default_out(model: str) -> Path:
    """Where `train-heads` writes when --out is not given: $TOKENSWIFT_HOME/heads/NAME.safetensors."""
    from tokenswift_cli.model.heads import SHIPPED
    from tokenswift_cli.paths import home_dir

    name = SHIPPED.get(model) or f"{Path(model).name.removesuffix('.gguf')}.safetensors"
    return home_dir() / "heads" / name


@errors()
def train_heads_command(
    model: ModelOpt = "default",
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Heads file to write.", show_default=False)] = None,
    num_heads: Annotated[int, typer.Option("--num-heads", min=1, help="K: heads to train.")] = 3,
    data: Annotated[
        list[Path] | None,
        typer.Option(
            "--data", help="Also train on this text file (repeatable); --samples 0 for files only.", show_default=False
        ),  # fmt: skip
    ] = None,
    samples: Annotated[int, typer.Option(help="Texts the model writes itself.", min=0)] = 32,
    sample_tokens: Annotated[int, typer.Option(help="Tokens per self-written text.", min=8)] = 512,
    long_windows: Annotated[int, typer.Option(help="Long windows: the texts joined and read back.", min=0)] = 2,
    long_tokens: Annotated[int, typer.Option(help="Tokens per long window.", min=8)] = 4096,
    target: Annotated[str, typer.Option(help="soft (the model's distribution) or hard (the token).")] = "soft",
    steps: Annotated[int, typer.Option(min=1, help="Optimizer steps.")] = 1500,
    batch_size: Annotated[int, typer.Option(min=1, help="Rows per step.")] = 256,
    lr: Annotated[float, typer.Option(help="Peak learning rate.")] = 2e-3,
    minutes: Annotated[float | None, typer.Option(help="Stop training after this many minutes.")] = None,
    seed: Annotated[int, typer.Option(help="Seed of prompts, sampling and batches.")] = 0,
    eval_text: TextFiles = None,
) -> None:
    """Train draft heads for a model (the model stays frozen). Ctrl-C stops training and still saves."""
    from tokenswift_cli.config import ConfigError, ModelSpec
    from tokenswift_cli.model.loading import load_model
    from tokenswift_cli.train.data import Rows
    from tokenswift_cli.train.fit import TrainConfig
    from tokenswift_cli.train.run import (
        DataConfig,
        HeadsReport,
        distilled_rows,
        file_rows,
        fit,
        held_out_accuracy,
        training_metadata,
    )

    if target not in ("soft", "hard"):
        raise ConfigError("--target must be soft or hard")
    cfg = TrainConfig(target=target, steps=steps, batch_size=batch_size, lr=lr, seed=seed,  # type: ignore[arg-type]
                      max_seconds=minutes * 60 if minutes else None)  # fmt: skip
    files = tuple(str(f) for f in data or ())
    data_cfg = DataConfig(
        samples=samples, sample_tokens=sample_tokens, long_windows=long_windows, long_tokens=long_tokens,
        files=files, seed=seed,
    )  # fmt: skip
    out = out or default_out(model)
    loaded = load_model(ModelSpec(name=model, weights="dense"), attn_implementation="sdpa")
    with _progress() as bar:
        task = bar.add_task("writing training text", total=None)
        update = lambda name, done, total: bar.update(task, description=name, completed=done, total=total)  # noqa: E731
        rows, held_out = distilled_rows(loaded, data_cfg, heads=num_heads, progress=update)
        if files:
            bar.update(task, description="reading text files")
            rows = Rows.concat([rows, file_rows(loaded, files, window=data_cfg.file_tokens, heads=num_heads)])
    _say(f"{rows.size} training rows, {held_out.size} held-out rows")
    with _progress() as bar:
        task = bar.add_task("training", total=cfg.steps)

        def show(report: Any) -> None:
            heads_acc = " ".join(f"{a:.2f}" for a in report.top1)
            bar.update(task, completed=report.step, description=f"loss {report.loss:.3f} top-1 {heads_acc}")
            if bar.disable and report.step % 50 == 0:  # no live bar (not a terminal): a log line now and then
                _say(f"step {report.step}/{cfg.steps} loss {report.loss:.3f} top-1 {heads_acc} {report.seconds:.0f}s")

        base = {"base_model_name": loaded.name, "training": json.dumps(cfg.to_dict())}
        started = time.monotonic()
        heads, done = fit(loaded, rows, cfg, out=out, metadata=base, on_step=show)
        seconds = time.monotonic() - started
    slices = {"held-out": held_out}
    if eval_text:
        slices["eval-text"] = file_rows(loaded, [str(f) for f in eval_text], window=4096, heads=num_heads, limit=4096)
    report = HeadsReport(steps=done, seconds=seconds, accuracy=held_out_accuracy(heads, loaded, slices))
    from tokenswift_cli.model.heads import save_heads

    save_heads(heads, out, training_metadata(loaded, data_cfg, cfg, report))
    _accuracy_table(report.accuracy)
    _say(f"wrote {out} ({done} steps)")


@errors()
def import_command(
    source: Annotated[Path, typer.Argument(help="TokenSwift model checkpoint: a weights file or a model folder.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Heads file to write.")],
    model: Annotated[
        str | None, typer.Option("--model", "-m", help="Check against this model and record its identity.")
    ] = None,
) -> None:
    """Import the heads stored inside a TokenSwift model checkpoint (`model.medusa_layers.*`)."""
    from tokenswift_cli.model.heads import HeadsError, import_heads, model_identity, save_heads

    metadata = {"imported_from": str(source), "format": "tokenswift-heads-v1"}
    config = None
    if model is not None:
        from tokenswift_cli.config import ModelSpec
        from tokenswift_cli.model.loading import load_model

        loaded = load_model(ModelSpec(name=model, weights="dense"))
        config = loaded.model.config
        metadata |= model_identity(loaded.fingerprint, loaded.source) | {"base_model_name": loaded.name}
    try:
        heads = import_heads(source, config)
    except HeadsError as error:
        raise typer.BadParameter(str(error)) from None
    save_heads(heads, out, metadata)
    _say(f"wrote {out}: {heads.num_heads} heads, hidden size {heads.hidden_size}")


@errors()
def eval_command(
    heads_path: Annotated[Path, typer.Argument(help="Heads file (.safetensors).")],
    text: Annotated[list[Path], typer.Option("--text", help="Text file to measure on (repeatable).")],
    model: ModelOpt = "default",
    tokens: Annotated[int, typer.Option(help="Tokens read from each file (from its start).", min=16)] = 4096,
    as_json: Annotated[bool, typer.Option("--json", help="Print the accuracy as JSON.")] = False,
) -> None:
    """Per-head top-1/top-3 accuracy on text files, at short and long positions."""
    from tokenswift_cli.config import ModelSpec
    from tokenswift_cli.model.heads import resolve_heads
    from tokenswift_cli.model.loading import load_model
    from tokenswift_cli.train.run import file_rows, held_out_accuracy

    loaded = load_model(ModelSpec(name=model, weights="dense"), attn_implementation="sdpa")
    heads, _ = resolve_heads(str(heads_path), loaded)
    assert heads is not None
    rows = file_rows(loaded, [str(t) for t in text], window=tokens, heads=heads.num_heads, limit=tokens)
    accuracy = held_out_accuracy(heads, loaded, {"text": rows})
    if as_json:
        typer.echo(json.dumps({k: v.to_dict() for k, v in accuracy.items()}, indent=1))
    else:
        _accuracy_table(accuracy)


@errors()
def info_command(heads_path: Annotated[Path, typer.Argument(help="Heads file (.safetensors).")]) -> None:
    """Print the metadata of a heads file (model identity, settings, accuracy)."""
    from tokenswift_cli.model.heads import read_metadata

    meta = read_metadata(heads_path)
    decoded = {k: _maybe_json(v) for k, v in sorted(meta.items())}
    typer.echo(json.dumps(decoded, indent=1))


def _maybe_json(value: str) -> object:
    try:
        return json.loads(value)
    except ValueError:
        return value


def _progress() -> Any:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=console, disable=not console.is_terminal)  # fmt: skip


def _say(message: str) -> None:
    typer.echo(message, err=True)


def _accuracy_table(accuracy: dict[str, Accuracy]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table("slice", "rows", "top-1 (text)", "top-3 (text)", "top-1 (model)", "top-3 (model)")
    fmt = lambda xs: " ".join(f"{x:.3f}" for x in xs)  # noqa: E731
    for name, acc in accuracy.items():
        table.add_row(name, str(acc.rows), fmt(acc.top1), fmt(acc.top3), fmt(acc.model_top1), fmt(acc.model_top3))
    Console(stderr=True).print(table)
