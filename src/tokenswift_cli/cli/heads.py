"""Commands for draft heads: `heads import | eval | info` (`train-heads` is in train_heads.py).

Thin wrappers: they parse, call `train.run` / `model.heads`, and render progress and tables on stderr.
Nothing heavy is imported at module load, so `tokenswift --help` stays instant.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from tokenswift_cli.cli.errors import errors
from tokenswift_cli.cli.help import Command, Group
from tokenswift_cli.cli.options import CpuDeviceOpt, ModelOpt

if TYPE_CHECKING:
    from tokenswift_cli.train.fit import Accuracy

IMPORT_EXAMPLE = (
    "Example: tokenswift heads import ./TokenSwift-llama3.1-8b --out llama3.1-8b.safetensors "
    "--model meta-llama/Llama-3.1-8B"
)
EVAL_EXAMPLE = (
    "Example: tokenswift heads eval my-heads.safetensors --text prompts/letters.txt "
    "--prefix-tokens 256 --prefix-tokens 4096"
)
INFO_EXAMPLE = "Example: tokenswift heads info my-heads.safetensors"

TextFiles = Annotated[
    list[Path] | None,
    typer.Option("--eval-text", help="Also measure accuracy on this text file (repeatable).", show_default=False),
]


def register(app: typer.Typer) -> None:
    """Add the `heads` group to the main app."""
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
    say(f"wrote {out}: {heads.num_heads} heads, hidden size {heads.hidden_size}")


@errors()
def eval_command(
    heads_path: Annotated[str, typer.Argument(help="Heads file (.safetensors), or 'default' (the shipped heads).")],
    text: Annotated[
        list[Path] | None,
        typer.Option(
            "--text", help="Text file to measure on (repeatable; default: the held-out text).", show_default=False
        ),
    ] = None,
    model: ModelOpt = "default",
    device: CpuDeviceOpt = "cpu",
    tokens: Annotated[
        int, typer.Option(help="Tokens read from each file for the accuracy (from its start).", min=16)
    ] = 4096,
    prefix_tokens: Annotated[
        list[int] | None,
        typer.Option(
            help="Tokens per file before the model writes (repeatable: short and long; default: 1024).",
            show_default=False,
        ),
    ] = None,
    new_tokens: Annotated[int, typer.Option(help="Tokens the model writes after each prefix.", min=2)] = 512,
    seed: Annotated[int, typer.Option(help="Seed of the written text.")] = 0,
    greedy: Annotated[bool, typer.Option("--greedy", help="Greedy decoding instead of the paper's sampling.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON on stdout.")] = False,
) -> None:
    """Per-head top-1/top-3 against the model's own next tokens at short and long positions, and the tokens
    per step of the paper's tree at the paper's sampling (or greedy), with and without the heads, beside the oracle."""
    from dataclasses import replace

    from tokenswift_cli.config import DraftConfig, ModelSpec, SamplingConfig
    from tokenswift_cli.data import HELD_OUT_TEXT
    from tokenswift_cli.model.heads import resolve_heads
    from tokenswift_cli.model.loading import end_of_text_ids, load_model
    from tokenswift_cli.sampling.defaults import PAPER
    from tokenswift_cli.train.acceptance import replay_file
    from tokenswift_cli.train.run import file_rows, held_out_accuracy

    files = text or [HELD_OUT_TEXT]
    loaded = load_model(ModelSpec(name=model, weights="dense", dtype="float32", device=device),
                        attn_implementation="sdpa")  # fmt: skip
    heads, _ = resolve_heads(heads_path, loaded)
    if heads is None:
        raise typer.BadParameter(f"no heads to measure: {heads_path}")
    heads = heads.to(loaded.model.device)
    rows = file_rows(loaded, [str(t) for t in files], window=tokens, heads=heads.num_heads, limit=tokens)
    accuracy = held_out_accuracy(heads, loaded, {"text": rows})
    sampling = replace(
        SamplingConfig() if greedy else PAPER, seed=seed, suppress_token_ids=tuple(end_of_text_ids(loaded))
    )
    replays = [
        {"file": f.name, **replay_file(loaded, heads, f.read_text(encoding="utf-8"), prefix_tokens=n,
                                       new_tokens=new_tokens, sampling=sampling).to_dict()}
        for f in files for n in prefix_tokens or [1024]
    ]  # fmt: skip
    report = {
        "heads": heads_path, "model": loaded.name, "device": str(loaded.model.device),
        "settings": {"sampling": sampling.to_dict(), "tree": list(DraftConfig().tree),
                     "ngram_top_k": DraftConfig().ngram_top_k, "new_tokens": new_tokens},
        "accuracy": {k: v.to_dict() for k, v in accuracy.items()}, "tokens_per_step": replays,
    }  # fmt: skip
    if as_json:
        typer.echo(json.dumps(report, indent=1))
    else:
        accuracy_table(accuracy)
        replay_table(replays)


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


def progress_bar() -> Any:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=console, disable=not console.is_terminal)  # fmt: skip


def say(message: str) -> None:
    typer.echo(message, err=True)


def accuracy_table(accuracy: dict[str, Accuracy]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table("slice", "rows", "top-1 (text)", "top-3 (text)", "top-1 (model)", "top-3 (model)")
    fmt = lambda xs: " ".join(f"{x:.3f}" for x in xs)  # noqa: E731
    for name, acc in accuracy.items():
        table.add_row(name, str(acc.rows), fmt(acc.top1), fmt(acc.top3), fmt(acc.model_top1), fmt(acc.model_top3))
    Console(stderr=True).print(table)


def replay_table(replays: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table("text", "prefix", "tokens", "with heads", "no heads", "oracle", "heads, no lag", "none, no lag",
                  "heads, every root", "none, every root", "drawn top-1 / top-3",
                  title="tokens per step: the paper's tree and sampling")  # fmt: skip
    for r in replays:
        rates = (r["heads"], r["no_heads"], r["oracle"], r["heads_no_lag"], r["no_heads_no_lag"],
                 r["heads_every_root"], r["no_heads_every_root"])  # fmt: skip
        table.add_row(r["file"], str(r["prefix_tokens"]), str(r["tokens"]), *(f"{x:.3f}" for x in rates),
                      f"{r['drawn_top1']:.2f} / {r['drawn_top3']:.2f}")  # fmt: skip
    Console(stderr=True).print(table)
