"""`train-heads` end to end: build the rows, train, evaluate on held-out text, save with metadata.

The steps are separate functions so that the CLI only wires them to its progress display, and an
interrupted run can be resumed: the self-distilled rows are cached per batch under `cache_dir()`.
"""

from __future__ import annotations

import copy
import hashlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from tokenswift_cli.config import ConfigError
from tokenswift_cli.data import HELD_OUT_TEXT
from tokenswift_cli.model.heads import DraftHeads, model_identity, save_heads
from tokenswift_cli.model.loading import LoadedModel, end_of_text_ids
from tokenswift_cli.paths import cache_dir
from tokenswift_cli.train.data import DistillConfig, Rows, empty_rows, self_distill, teacher_forced
from tokenswift_cli.train.fit import (
    Accuracy,
    StepReport,
    TrainConfig,
    evaluate,
    lm_head_weight,
    split_by_position,
    train_heads,
)
from tokenswift_cli.train.prompts import encode, held_out_prompts, training_prompts


@dataclass(frozen=True)
class DataConfig:
    """Where the rows come from: self-distilled text and/or text files.

    Long positions: writing thousands of tokens per sample is too slow on a shared CPU (~20 tokens/s
    here), so `long_windows` windows of `long_tokens` tokens are made by joining the self-written texts
    end to end and reading them back; the heads then also see states deep into a long context.
    """

    samples: int = 32
    sample_tokens: int = 512
    long_windows: int = 2
    long_tokens: int = 4096
    held_out_samples: int = 8
    files: tuple[str, ...] = ()
    file_tokens: int = 4096  # each file is read in windows of this many tokens
    file_skip: int = 0  # tokens left unread at the start of each file (the benchmark prefixes: 4096)
    file_passes: int = 1  # passes over each file, pass j's windows shifted by j/passes of a window
    continuations: int = 0  # texts the model writes after windows of the files (sample_tokens each)
    continuation_prompt: int = 1024  # tokens of a file before each continuation
    continuation_batch: int | None = None  # continuations written at once (None: batch_size)
    generation_dtype: str = "bfloat16"  # a bf16 copy writes ~1.5x faster on CPU; rows are read in fp32 later
    batch_size: int = 16
    seed: int = 0
    write_minutes: float | None = None  # no new batch is written after this long: a time budget

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True)
class HeadsReport:
    """What a training run measured: its size and times, held-out accuracy per slice (e.g. "held-out <512")."""

    steps: int
    seconds: float
    rows: int = 0
    data_seconds: float = 0.0
    device: str = "cpu"
    accuracy: dict[str, Accuracy] = field(default_factory=dict)


Progress = Callable[[str, int, int], None]  # (task, done, total)


def rows_cache(loaded: LoadedModel) -> Path:
    """Self-distilled rows of a model, cached per batch (see `train_data.self_distill`)."""
    return cache_dir() / "heads-data" / loaded.fingerprint[:16]


def distilled_rows(
    loaded: LoadedModel, cfg: DataConfig, *, heads: int, progress: Progress | None = None
) -> tuple[Rows, Rows]:
    """(training rows, held-out rows) from the model's own writing; cached per batch."""
    if loaded.tokenizer is None:
        raise ValueError("self-distillation needs the model's tokenizer; pass text files with --data")
    # A copy: casting the model itself down and back up would round its weights.
    model = copy.deepcopy(loaded.model).to(getattr(torch, cfg.generation_dtype))
    prompts = training_prompts(cfg.samples, cfg.seed)
    jobs = [
        (held_out_prompts(cfg.held_out_samples), cfg.seed + 10_000),
        (prompts, cfg.seed),
    ]
    total = sum(len(p) for p, _ in jobs) * cfg.sample_tokens
    done, parts = 0, []
    deadline = time.monotonic() + cfg.write_minutes * 60 if cfg.write_minutes is not None else None
    for chosen, seed in jobs:
        ids = [encode(loaded.tokenizer, p) for p in chosen]
        distill = DistillConfig(new_tokens=cfg.sample_tokens, batch_size=cfg.batch_size, seed=seed)

        def advance(count: int) -> None:
            nonlocal done
            done += count * cfg.sample_tokens
            if progress is not None:
                progress("writing training text", done, total)

        suppress = list(end_of_text_ids(loaded))
        rows = self_distill(model, ids, distill, heads=heads, suppress=suppress, folder=rows_cache(loaded),
                            on_batch=advance, deadline=deadline)  # fmt: skip
        parts.append(rows)
    held_out, short = parts
    long = long_rows(loaded, short, windows=cfg.long_windows, length=cfg.long_tokens, heads=heads)
    return Rows.concat([short, long]), held_out


def texts_of(rows: Rows) -> list[list[int]]:
    """The token sequences rows were cut from (from their third token on), split where positions restart."""
    breaks = (rows.positions[1:] != rows.positions[:-1] + 1).nonzero().flatten() + 1
    bounds = [0, *breaks.tolist(), rows.size] if rows.size else []
    return [
        [*rows.targets[a:b, 0].tolist(), *rows.targets[b - 1, 1:].tolist()]
        for a, b in zip(bounds, bounds[1:], strict=False)
    ]


def long_rows(loaded: LoadedModel, rows: Rows, *, windows: int, length: int, heads: int) -> Rows:
    """Rows at long positions: the texts of `rows` joined end to end, read back in windows of `length`."""
    assert loaded.tokenizer is not None
    separator = loaded.tokenizer("\n\n")["input_ids"]
    stream = [t for text in texts_of(rows) for t in (*text, *separator)]
    parts = [empty_rows(int(loaded.model.config.hidden_size), heads)]
    for w in range(windows):
        window = stream[w * length : (w + 1) * length]
        if len(window) == length:
            parts.append(read_window(loaded, window, heads=heads, cache=True))
    return Rows.concat(parts)


def read_window(loaded: LoadedModel, tokens: list[int], *, heads: int, cache: bool = False) -> Rows:
    """`teacher_forced` rows of one window; with `cache`, kept beside the self-written rows (keyed by the tokens)."""
    if not cache:
        return teacher_forced(loaded.model, tokens, heads=heads)
    key = hashlib.sha256(json.dumps([tokens, heads]).encode()).hexdigest()[:16]
    path = rows_cache(loaded) / f"read-{key}.safetensors"
    if path.is_file():
        return Rows.load(path)
    rows = teacher_forced(loaded.model, tokens, heads=heads)
    rows.save(path)
    return rows


def continuation_rows(loaded: LoadedModel, cfg: DataConfig, *, heads: int, progress: Progress | None = None) -> Rows:
    """Rows of the model's own continuations of windows of `cfg.files` (after their first `file_skip` tokens).

    The text users ask for: long literary or technical context, then the model's own sampled writing,
    at the positions of a real run (`continuation_prompt` and on). Windows start at seeded random
    places of all files alike; cached and time-budgeted per batch as the other self-written texts.
    """
    if not cfg.continuations or not cfg.files:
        return empty_rows(int(loaded.model.config.hidden_size), heads)
    if loaded.tokenizer is None:
        raise ValueError("continuing text files needs the model's tokenizer")
    texts = [loaded.tokenizer(Path(n).read_text(encoding="utf-8"))["input_ids"][cfg.file_skip :] for n in cfg.files]
    starts = [(i, s) for i, ids in enumerate(texts) for s in range(len(ids) - cfg.continuation_prompt + 1)]
    if not starts:
        raise ConfigError(f"the --data files are shorter than {cfg.continuation_prompt} tokens after the skipped ones")
    generator = torch.Generator().manual_seed(cfg.seed)
    picks = torch.randint(len(starts), (cfg.continuations,), generator=generator).tolist()
    prompts = [texts[i][s : s + cfg.continuation_prompt] for i, s in (starts[p] for p in picks)]
    model = copy.deepcopy(loaded.model).to(getattr(torch, cfg.generation_dtype))
    batch = cfg.continuation_batch or cfg.batch_size
    distill = DistillConfig(new_tokens=cfg.sample_tokens, batch_size=batch, seed=cfg.seed + 20_000)
    done = 0

    def advance(count: int) -> None:
        nonlocal done
        done += count * cfg.sample_tokens
        if progress is not None:
            progress("continuing text files", done, len(prompts) * cfg.sample_tokens)

    deadline = time.monotonic() + cfg.write_minutes * 60 if cfg.write_minutes is not None else None
    return self_distill(model, prompts, distill, heads=heads, suppress=list(end_of_text_ids(loaded)),
                        folder=rows_cache(loaded), on_batch=advance, deadline=deadline)  # fmt: skip


def check_training_files(files: Sequence[str]) -> tuple[str, ...]:
    """The training files, refusing the text reserved for held-out evaluation (`data.HELD_OUT_TEXT`)."""
    reserved = HELD_OUT_TEXT.read_bytes()
    for name in files:
        path = Path(name)
        if path.is_file() and path.stat().st_size == len(reserved) and path.read_bytes() == reserved:
            raise ConfigError(f"{name} is the held-out text ({HELD_OUT_TEXT.name}): heads are measured on it")
    return tuple(files)


def file_rows(
    loaded: LoadedModel, files: Sequence[str], *, window: int, heads: int, limit: int | None = None, skip: int = 0,
    passes: int = 1, cache: bool = False, progress: Progress | None = None,
) -> Rows:  # fmt: skip
    """Rows of text files read teacher-forced in windows of `window` tokens: the first `limit` tokens of
    each file after its first `skip`, in `passes` passes whose windows are shifted by `window / passes`
    (the same tokens at other positions). `cache`: each window's rows are kept (see `read_window`)."""
    if loaded.tokenizer is None:
        raise ValueError("reading text files needs the model's tokenizer")
    parts = [empty_rows(int(loaded.model.config.hidden_size), heads)]
    texts = [loaded.tokenizer(Path(name).read_text(encoding="utf-8"))["input_ids"][skip:][:limit] for name in files]
    windows = [
        ids[start : start + window]
        for ids in texts for shift in range(0, window, -(-window // passes))[:passes]
        for start in range(shift, len(ids), window) if len(ids) - start > heads + 2
    ]  # fmt: skip
    for done, tokens in enumerate(windows):
        parts.append(read_window(loaded, tokens, heads=heads, cache=cache))
        if progress is not None:
            progress("reading text files", (done + 1) * window, len(windows) * window)
    return Rows.concat(parts)


def new_heads(loaded: LoadedModel, num_heads: int, rows: Rows | None = None, *, chained: bool = True) -> DraftHeads:
    """Heads that start out predicting what the base model predicts next.

    The pre-norm residual stream is large (RMS ~40 for SmolLM2-135M): starting the input norms at
    that scale lets `W` move the state at a useful rate from the first steps (measured: lower loss
    after 150 steps than W at lr 1e-2 with unit norms).
    """
    norm = loaded.model.get_decoder().norm.weight
    heads = DraftHeads.for_model(loaded.model.config, num_heads, norm_weight=norm.cpu(), chained=chained)
    if rows is not None and rows.size:
        scale = float(rows.hidden[:4096].float().pow(2).mean(-1).sqrt().mean())
        for block in heads.blocks:
            block.input_layernorm.weight.data.fill_(scale)
    return heads


def state_path(out: Path) -> Path:
    """The resumable training state beside the heads file: present only while a run is unfinished."""
    return out.with_name(out.name + ".state")


def fit(
    loaded: LoadedModel,
    rows: Rows,
    cfg: TrainConfig,
    *,
    out: Path,
    metadata: dict[str, str],
    on_step: Callable[[StepReport], None] | None = None,
) -> tuple[DraftHeads, int]:
    """Train new heads on `rows` on the model's device, checkpointing to `out` (usable heads) and to
    `state_path(out)` (the loop's state: a later call with the same settings continues there)."""
    torch.manual_seed(cfg.seed)
    heads = new_heads(loaded, rows.num_heads, rows, chained=cfg.chained).to(loaded.model.device)
    weight = lm_head_weight(loaded.model)
    save = lambda step: save_heads(heads, out, {**metadata, "steps": str(step), "complete": "false"})  # noqa: E731
    steps = train_heads(heads, weight, rows, cfg, on_step=on_step, on_checkpoint=save, state_file=state_path(out))
    return heads, steps


def held_out_accuracy(heads: DraftHeads, loaded: LoadedModel, slices: dict[str, Rows]) -> dict[str, Accuracy]:
    """Accuracy per named slice of held-out rows, split further by position (short / long)."""
    weight = lm_head_weight(loaded.model)
    out = {}
    for name, rows in slices.items():
        for part, sub in split_by_position(rows).items():
            if sub.size:
                out[f"{name} {part}"] = evaluate(heads, weight, sub)
    return out


def training_metadata(loaded: LoadedModel, data: DataConfig, train: TrainConfig, report: HeadsReport) -> dict[str, str]:
    """Checkpoint metadata: model identity, settings, and held-out accuracy (JSON strings)."""
    return {
        **model_identity(loaded.fingerprint, loaded.source),
        "base_model_name": loaded.name,
        "format": "tokenswift-heads-v1",
        "data": json.dumps(data.to_dict()),
        "training": json.dumps(train.to_dict()),
        "target": train.target,
        "steps": str(report.steps),
        "rows": str(report.rows),
        "device": report.device,
        "data_seconds": f"{report.data_seconds:.0f}",
        "train_seconds": f"{report.seconds:.0f}",
        "trained_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "accuracy": json.dumps({k: v.to_dict() for k, v in report.accuracy.items()}),
        "complete": "true",
    }
