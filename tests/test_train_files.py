"""Text files read for training: the skipped prefix, shifted passes, and the cache of read windows."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from cli_helpers import PREFIX, build_tiny_folder, cli

from tokenswift_cli.config import ConfigError, ModelSpec
from tokenswift_cli.model.heads import read_metadata
from tokenswift_cli.model.loading import LoadedModel, load_model
from tokenswift_cli.train.data import read_states, teacher_forced
from tokenswift_cli.train.run import DataConfig, continuation_rows, file_rows, rows_cache


@pytest.fixture
def tiny_and_text(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[LoadedModel, Path, list[int]]:
    """A tiny model (its rows cached under tmp_path), a text file and the text's token ids."""
    monkeypatch.setenv("TOKENSWIFT_CACHE", str(tmp_path / "cache"))
    loaded = load_model(ModelSpec(name=str(build_tiny_folder(tmp_path / "tiny")), weights="dense"))
    assert loaded.tokenizer is not None
    text = tmp_path / "text.txt"
    text.write_text(PREFIX * 4)
    return loaded, text, loaded.tokenizer(text.read_text())["input_ids"]


def test_file_rows_skip_the_prefix_and_shift_their_passes(tiny_and_text: tuple[LoadedModel, Path, list[int]]) -> None:
    loaded, text, ids = tiny_and_text
    skip, window = 10, 32
    rows = file_rows(loaded, [str(text)], window=window, heads=2, skip=skip, passes=2, cache=True)
    rest = ids[skip:]
    starts = [*range(0, len(rest), window), *range(window // 2, len(rest), window)]
    expected = [teacher_forced(loaded.model, rest[s : s + window], heads=2) for s in starts if len(rest) - s > 4]
    assert rows.size == sum(e.size for e in expected)
    assert torch.equal(rows.targets, torch.cat([e.targets for e in expected]))
    assert torch.equal(rows.positions, torch.cat([e.positions for e in expected]))  # positions within each window
    assert rows.targets[0, 0] == ids[skip + 2]  # the skipped tokens are never read
    cached = sorted(rows_cache(loaded).glob("read-*.safetensors"))
    assert len(cached) == len({tuple(rest[s : s + window]) for s in starts if len(rest) - s > 4})  # one per window text
    again = file_rows(loaded, [str(text)], window=window, heads=2, skip=skip, passes=2, cache=True)
    assert torch.equal(again.hidden, rows.hidden) and torch.equal(again.teacher_logp, rows.teacher_logp)


def test_continuations_write_after_windows_of_the_files(tiny_and_text: tuple[LoadedModel, Path, list[int]]) -> None:
    """The model continues seeded windows of the files (after the skipped prefix); rows start at the
    end of each window's prompt, cached per batch, the same on a second call."""
    loaded, text, ids = tiny_and_text
    cfg = DataConfig(files=(str(text),), file_skip=10, continuations=3, continuation_prompt=20, sample_tokens=12,
                     batch_size=2, generation_dtype="float32")  # fmt: skip
    rows = continuation_rows(loaded, cfg, heads=2)
    per_text = 12 - 2  # the prompt's last state and 11 written ones, less the deepest head's lookahead
    assert rows.size == 3 * per_text
    assert rows.positions.tolist() == [*range(19, 19 + per_text)] * 3
    windows = [ids[10 + s : 30 + s] for s in range(len(ids) - 29)]
    last_states = torch.stack([read_states(loaded.model, torch.tensor(w))[0][-1] for w in windows])
    for first in range(0, rows.size, per_text):  # a text's first row: the last state of a window of the file
        assert (rows.hidden[first].float() - last_states).abs().amax(-1).min() < 1e-3  # stored in bfloat16
    assert len(list(rows_cache(loaded).glob("batch-*.safetensors"))) == 2
    again = continuation_rows(loaded, cfg, heads=2)
    assert torch.equal(again.targets, rows.targets) and torch.equal(again.hidden, rows.hidden)
    with pytest.raises(ConfigError, match="shorter than 9999"):
        continuation_rows(loaded, replace(cfg, continuation_prompt=9999), heads=2)


def test_train_heads_continues_the_data_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--data-continuations` adds the written continuations to the rows read from `--data`; the metadata says so."""
    monkeypatch.setenv("TOKENSWIFT_CACHE", str(tmp_path / "cache"))
    model = build_tiny_folder(tmp_path / "tiny")
    text = tmp_path / "text.txt"
    text.write_text(PREFIX * 4)
    out = tmp_path / "heads.safetensors"
    result = cli(
        "train-heads", "-m", model, "--out", out, "--samples", 0, "--held-out-samples", 0, "--long-windows", 0,
        "--data", text, "--data-continuations", 3, "--data-prompt-tokens", 16, "--sample-tokens", 10,
        "--write-batch", 2, "--data-write-batch", 1, "--steps", 2, "--batch-size", 8, "--num-heads", 2,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    meta = read_metadata(out)
    words = len(PREFIX.split()) * 4
    assert int(meta["rows"]) == (words - 1 - 2) + 3 * (10 - 2)  # the file read, then three continuations
    data = json.loads(meta["data"])
    assert data["continuations"] == 3 and data["continuation_prompt"] == 16 and data["continuation_batch"] == 1
    assert len(list((tmp_path / "cache").rglob("batch-*.safetensors"))) == 3  # one continuation per batch
    result = cli("train-heads", "-m", model, "--out", out, "--samples", 0, "--long-windows", 0, "--data", text,
                 "--data-continuations", 1, "--data-prompt-tokens", 9999, "--steps", 1)  # fmt: skip
    assert result.exit_code != 0 and "shorter than 9999 tokens" in result.output
