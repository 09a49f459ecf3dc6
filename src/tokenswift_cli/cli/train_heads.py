"""`tokenswift train-heads`: self-distillation, training and held-out accuracy, with a progress bar.

Thin: flags into `DataConfig` / `TrainConfig`, then the steps of `train.run`. An interrupted run
resumes when started again with the same flags (the written text is cached per batch, the training
loop's state sits beside --out); `--fresh` starts the training over.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer

from tokenswift_cli.cli.errors import errors
from tokenswift_cli.cli.heads import TextFiles, accuracy_table, default_out, progress_bar, say
from tokenswift_cli.cli.help import Command
from tokenswift_cli.cli.options import CpuDeviceOpt, ModelOpt

EXAMPLE = (
    "Example: tokenswift train-heads --device cuda --samples 256 --sample-tokens 2048 --write-batch 256 "
    "--out my-heads.safetensors"
)
_DATA, _TRAIN = "Training data", "Training"


def register(app: typer.Typer) -> None:
    app.command("train-heads", cls=Command, epilog=EXAMPLE)(train_heads_command)


def _opt(help: str, panel: str = _TRAIN, *decls: str, **kwargs: Any) -> Any:
    return typer.Option(*decls, help=help, rich_help_panel=panel, **kwargs)


@errors()
def train_heads_command(
    model: ModelOpt = "default",
    device: CpuDeviceOpt = "cpu",
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Heads file to write.", show_default=False)] = None,
    num_heads: Annotated[int, _opt("K: heads to train (the tree's depth below level 1).", min=1)] = 3,
    chained: Annotated[
        bool,
        _opt("Head k reads head k-1's state (the reference), or all read the model's.", _TRAIN, "--chained/--parallel"),
    ] = True,
    target: Annotated[str, _opt("soft (the model's distribution) or hard (its sampled token).")] = "soft",
    data: Annotated[
        list[Path] | None,
        _opt("Also train on this text file (repeatable); --samples 0 for files only.", _DATA, show_default=False),
    ] = None,
    data_skip: Annotated[
        int, _opt("Tokens left unread at the start of each --data file (4096: the benchmark prefixes).", _DATA, min=0)
    ] = 0,
    data_passes: Annotated[
        int, _opt("Passes over each --data file, windows shifted (other positions).", _DATA, min=1)
    ] = 1,
    data_continuations: Annotated[
        int, _opt("Texts the model writes after windows of the --data files (--sample-tokens each).", _DATA, min=0)
    ] = 0,
    data_prompt_tokens: Annotated[int, _opt("Tokens of a --data file before each continuation.", _DATA, min=1)] = 1024,
    data_write_batch: Annotated[
        int | None, _opt("Continuations written at once (default: --write-batch).", _DATA, min=1, show_default=False)
    ] = None,
    samples: Annotated[int, _opt("Texts the model writes itself.", _DATA, min=0)] = 32,
    sample_tokens: Annotated[int, _opt("Tokens per self-written text.", _DATA, min=8)] = 512,
    write_batch: Annotated[int, _opt("Texts written at once (hundreds on a GPU).", _DATA, min=1)] = 16,
    long_windows: Annotated[int, _opt("Long windows: the texts joined and read back.", _DATA, min=0)] = 2,
    long_tokens: Annotated[int, _opt("Tokens per long window.", _DATA, min=8)] = 4096,
    write_minutes: Annotated[
        float | None,
        _opt("Write no new batch after this many minutes (texts, continuations: each).", _DATA, show_default=False),
    ] = None,
    held_out_samples: Annotated[int, _opt("Held-out texts written from subjects never trained on.", _DATA, min=0)] = 8,
    steps: Annotated[int, _opt("Optimizer steps.", min=1)] = 1500,
    batch_size: Annotated[int, _opt("Rows per step.", min=1)] = 256,
    lr: Annotated[float, _opt("Peak learning rate.")] = 2e-3,
    minutes: Annotated[float | None, _opt("Stop training after this many minutes.")] = None,
    seed: Annotated[int, _opt("Seed of prompts, sampling and batches.")] = 0,
    fresh: Annotated[bool, _opt("Start the training over instead of resuming an interrupted run.")] = False,
    eval_text: TextFiles = None,
) -> None:
    """Train draft heads for a model (the model stays frozen). Ctrl-C stops training and still saves."""
    from tokenswift_cli.config import ConfigError, ModelSpec
    from tokenswift_cli.model.heads import save_heads
    from tokenswift_cli.model.loading import load_model
    from tokenswift_cli.train.data import Rows
    from tokenswift_cli.train.fit import TrainConfig
    from tokenswift_cli.train.run import (
        DataConfig,
        HeadsReport,
        check_training_files,
        continuation_rows,
        distilled_rows,
        file_rows,
        fit,
        held_out_accuracy,
        state_path,
        training_metadata,
    )

    if target not in ("soft", "hard"):
        raise ConfigError("--target must be soft or hard")
    cfg = TrainConfig(target=target, chained=chained, steps=steps, batch_size=batch_size, lr=lr,  # type: ignore[arg-type]
                      seed=seed, max_seconds=minutes * 60 if minutes else None)  # fmt: skip
    files = check_training_files([str(f) for f in data or ()])
    data_cfg = DataConfig(
        samples=samples, sample_tokens=sample_tokens, long_windows=long_windows, long_tokens=long_tokens,
        held_out_samples=held_out_samples, files=files, batch_size=write_batch, seed=seed, write_minutes=write_minutes,
        file_skip=data_skip, file_passes=data_passes, continuations=data_continuations,
        continuation_prompt=data_prompt_tokens, continuation_batch=data_write_batch,
    )  # fmt: skip
    out = out or default_out(model)
    if fresh:
        state_path(out).unlink(missing_ok=True)
    loaded = load_model(ModelSpec(name=model, weights="dense", dtype="float32", device=device),
                        attn_implementation="sdpa")  # fmt: skip
    started = time.monotonic()
    with progress_bar() as bar:
        task = bar.add_task("writing training text", total=None)

        def update(name: str, done: int, total: int) -> None:
            bar.update(task, description=name, completed=done, total=total)
            if bar.disable:  # no live bar (not a terminal): a log line per batch
                say(f"{name}: {done}/{total} tokens, {time.monotonic() - started:.0f} s")

        rows, held_out = distilled_rows(loaded, data_cfg, heads=num_heads, progress=update)
        if files:
            read = file_rows(loaded, files, window=data_cfg.file_tokens, heads=num_heads, skip=data_cfg.file_skip,
                             passes=data_cfg.file_passes, cache=True, progress=update)  # fmt: skip
            written = continuation_rows(loaded, data_cfg, heads=num_heads, progress=update)
            rows = Rows.concat([rows, read, written])
    data_seconds = time.monotonic() - started
    say(f"{rows.size} training rows, {held_out.size} held-out rows ({data_seconds:.0f} s)")
    with progress_bar() as bar:
        task = bar.add_task("training", total=cfg.steps)

        def show(report: Any) -> None:
            heads_acc = " ".join(f"{a:.2f}" for a in report.top1)
            bar.update(task, completed=report.step, description=f"loss {report.loss:.3f} top-1 {heads_acc}")
            if bar.disable and report.step % 50 == 0:  # no live bar (not a terminal): a log line now and then
                say(f"step {report.step}/{cfg.steps} loss {report.loss:.3f} top-1 {heads_acc} {report.seconds:.0f}s")

        base = {"base_model_name": loaded.name, "training": json.dumps(cfg.to_dict())}
        started = time.monotonic()
        heads, done = fit(loaded, rows, cfg, out=out, metadata=base, on_step=show)
        seconds = time.monotonic() - started
    report = HeadsReport(steps=done, seconds=seconds, rows=rows.size, data_seconds=data_seconds,
                         device=str(loaded.model.device))  # fmt: skip
    save_heads(heads, out, training_metadata(loaded, data_cfg, cfg, report))  # usable before the measuring
    slices = {"held-out": held_out}
    if eval_text:
        slices["eval-text"] = file_rows(loaded, [str(f) for f in eval_text], window=4096, heads=num_heads, limit=4096)
    report = replace(report, accuracy=held_out_accuracy(heads, loaded, slices))
    save_heads(heads, out, training_metadata(loaded, data_cfg, cfg, report))
    accuracy_table(report.accuracy)
    say(f"wrote {out} ({done} steps)")
