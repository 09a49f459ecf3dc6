"""Text files read for training: the skipped prefix, shifted passes, and the cache of read windows."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from cli_helpers import PREFIX, build_tiny_folder

from tokenswift_cli.config import ModelSpec
from tokenswift_cli.model.loading import load_model
from tokenswift_cli.train.data import teacher_forced
from tokenswift_cli.train.run import file_rows, rows_cache


def test_file_rows_skip_the_prefix_and_shift_their_passes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOKENSWIFT_CACHE", str(tmp_path / "cache"))
    loaded = load_model(ModelSpec(name=str(build_tiny_folder(tmp_path / "tiny")), weights="dense"))
    assert loaded.tokenizer is not None
    text = tmp_path / "text.txt"
    text.write_text(PREFIX * 4)
    ids = loaded.tokenizer(text.read_text())["input_ids"]
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
