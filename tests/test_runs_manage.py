"""Runs a user can manage: `runs` tells them apart, `runs rm` asks before deleting (and deletes nothing
when nobody can answer), and a `| head` preview cut before its first checkpoint leaves no run behind."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import (
    PREFIX,
    build_tiny_folder,
    cli,
    one_thread,
    run_dir,
    start_blocked_writer,
    wait_for,
    with_chat_template,
)

from tokenswift_cli.cli import runs as runs_command

LONG = 450  # tokens: their text overflows the 4 KiB pipe of `start_blocked_writer`, so the writer blocks on it


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    with one_thread():
        yield


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model, with a chat template so that it answers --prompt too."""
    return with_chat_template(build_tiny_folder(tmp_path_factory.mktemp("tiny-llama")))


@pytest.fixture
def prefix_file(tmp_path: Path) -> Path:
    path = tmp_path / "prefix.txt"
    path.write_text(PREFIX, encoding="utf-8")
    return path


def _write(tiny_folder: Path, *args: object) -> None:
    result = cli("write", "-n", 12, "-m", tiny_folder, "-q", *args)
    assert result.exit_code == 0, result.output


def _two_runs(tiny_folder: Path, prefix_file: Path, tmp_path: Path) -> Path:
    """run-001 continues the prefix file into --out; run-002 answers a prompt. Returns the --out file."""
    out = tmp_path / "story.txt"
    _write(tiny_folder, "-p", prefix_file, "-o", out)
    _write(tiny_folder, "--prompt", "vos kalo thamiren")
    return out


def _error_line(result: Any) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.output, result.output
    return lines[0]


def test_runs_lists_each_runs_start_prompt_or_prefix_and_out(
    tiny_folder: Path, prefix_file: Path, tmp_path: Path
) -> None:
    out = _two_runs(tiny_folder, prefix_file, tmp_path)
    listing = cli("runs")
    assert listing.exit_code == 0, listing.output
    head, first, second = listing.stdout.splitlines()
    assert head.split()[:3] == ["run", "started", "state"] and "prompt or prefix" in head and "--out" in head
    start = PREFIX.split()
    assert f"prefix: {start[0]} {start[1]}" in first and first.rstrip().endswith(
        runs_command.shortened(str(out), tail=True)
    )
    assert "run-002" in second and "prompt: vos kalo thamiren" in second
    assert all(len(cell) <= runs_command.SHORT for cell in first.split("  ") if cell.strip().startswith("prefix:"))
    data = json.loads(cli("runs", "--json").stdout)
    assert data[0]["out"] == str(out.absolute()) and data[0]["subject"].startswith("prefix: " + start[0])


def test_a_start_shows_its_year_only_when_it_is_not_this_one() -> None:
    now = datetime.now().astimezone()
    assert re.fullmatch(r"\d\d-\d\d \d\d:\d\d", runs_command.started(now.isoformat(), now=now))
    last_year = now.replace(year=now.year - 1)
    assert runs_command.started(last_year.isoformat(), now=now).startswith(f"{now.year - 1}-")


def test_shortened_keeps_one_line_and_the_end_of_a_path() -> None:
    assert runs_command.shortened("a\nb   c") == "a b c"
    assert runs_command.shortened("x" * 50, 10) == "x" * 9 + "…"
    assert runs_command.shortened("/very/long/path/to/story.txt", 12, tail=True) == "…o/story.txt"


def test_runs_rm_refuses_without_a_terminal_to_ask_on(tiny_folder: Path, prefix_file: Path, tmp_path: Path) -> None:
    """`echo n | tokenswift runs rm ...`: stdin is not a terminal, so nothing is deleted without --yes."""
    _two_runs(tiny_folder, prefix_file, tmp_path)
    for answer in ("n\n", "y\n", None):
        refused = cli("runs", "rm", "1", "2", input=answer)
        assert refused.exit_code == 2 and "add --yes to delete" in _error_line(refused)
    assert run_dir("run-001").is_dir() and run_dir("run-002").is_dir()


@pytest.mark.parametrize("answer", ["n\n", "\n", "y\n"], ids=["no", "enter", "yes"])
def test_runs_rm_asks_and_deletes_only_on_yes(
    tiny_folder: Path, prefix_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, answer: str
) -> None:
    _two_runs(tiny_folder, prefix_file, tmp_path)
    monkeypatch.setattr(runs_command, "stdin_is_terminal", lambda: True)
    result = cli("runs", "rm", "run-001", "2", input=answer)
    asked = result.stderr
    assert "run-001  done  12/12 tokens" in asked and "run-002  done" in asked and "prompt: vos kalo" in asked
    assert "Delete these 2 runs, checkpoints and text included? [y/N]" in asked and "Delete" not in result.stdout
    deleted = answer == "y\n"
    assert result.exit_code == (0 if deleted else 1) and ("nothing deleted" in asked) != deleted
    assert run_dir("run-001").exists() != deleted and run_dir("run-002").exists() != deleted


def test_runs_rm_yes_deletes_several_and_a_wrong_name_deletes_none(
    tiny_folder: Path, prefix_file: Path, tmp_path: Path
) -> None:
    out = _two_runs(tiny_folder, prefix_file, tmp_path)
    assert "no run named 'run-007'" in _error_line(cli("runs", "rm", "1", "run-007", "--yes"))
    assert run_dir("run-001").is_dir()  # checked before anything was deleted
    removed = cli("runs", "rm", "1", "run-002", "--yes")
    assert removed.exit_code == 0, removed.output
    assert not run_dir("run-001").exists() and not run_dir("run-002").exists()
    assert out.is_file()  # the user's --out file is theirs, not the run's


def _preview(process: subprocess.Popen[bytes], read: int) -> str:
    """Read the start of the text, as `| head -c 100` does, and close the pipe; the writer's stderr."""
    assert len(os.read(read, 100)) > 0
    os.close(read)
    _, stderr = process.communicate(timeout=600)
    assert process.returncode == 141, stderr  # as a process killed by SIGPIPE
    return stderr.decode()


def test_a_preview_cut_before_its_first_checkpoint_leaves_no_run(tiny_folder: Path, prefix_file: Path) -> None:
    process, read = start_blocked_writer("write", "-p", prefix_file, "-n", LONG, "-m", tiny_folder)
    wait_for(run_dir() / "text.txt", process)
    stderr = _preview(process, read)
    assert "before the first checkpoint: run-001 was not kept" in stderr
    assert not run_dir().exists() and "no runs" in cli("runs").stdout


@pytest.mark.parametrize("kept_by", ["checkpoint", "out"])
def test_a_preview_with_something_to_keep_stays_resumable(
    tiny_folder: Path, prefix_file: Path, tmp_path: Path, kept_by: str
) -> None:
    """Past its first checkpoint, or writing an --out file, the run stays: a resume finishes it."""
    extra = ("--checkpoint-every", 30) if kept_by == "checkpoint" else ("-o", tmp_path / "story.txt")
    process, read = start_blocked_writer("write", "-p", prefix_file, "-n", LONG, "-m", tiny_folder, *extra)
    saved = "kv-000002.safetensors" if kept_by == "checkpoint" else "manifest.json"  # past the prefix's, or its
    wait_for(run_dir() / "checkpoint" / saved, process)
    stderr = _preview(process, read)
    assert "stdout was closed; resume with:" in stderr and "not kept" not in stderr
    assert json.loads(cli("runs", "--json").stdout)[0]["resumable"]


def test_the_groups_runs_dir_counts_for_show_and_rm(tiny_folder: Path, prefix_file: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    _write(tiny_folder, "-p", prefix_file, "--runs-dir", elsewhere)
    shown = cli("runs", "--runs-dir", elsewhere, "--json", "show", "run-001")
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.stdout)["path"] == str(elsewhere / "run-001")
    removed = cli("runs", "--runs-dir", elsewhere, "rm", "run-001", "--yes")
    assert removed.exit_code == 0, removed.output
    assert not (elsewhere / "run-001").exists()
