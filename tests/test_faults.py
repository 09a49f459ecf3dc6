"""Faults at any moment: runs killed (SIGKILL, SIGINT, SIGTERM) at random points and resumed, the
resumes killed too, end with exactly the text of an uninterrupted run; failing checkpoint writes keep
the previous checkpoint; the lock; folders stopped while being created; `runs` on stopped runs."""

from __future__ import annotations

import dataclasses
import errno
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import PREFIX, build_tiny_folder, cli, one_thread, save_tiny_heads

from tokenswift_cli.runs import checkpoint, durable
from tokenswift_cli.runs.durable import RunLock

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "faults.py"
_SPEC = importlib.util.spec_from_file_location("faults", _PATH)
assert _SPEC is not None and _SPEC.loader is not None
faults = importlib.util.module_from_spec(_SPEC)
sys.modules["faults"] = faults  # its dataclasses look their module up
_SPEC.loader.exec_module(faults)

TOKENS, EVERY = 80, 4  # a checkpoint every 4 tokens: kills often land in one
TRIALS = {"kill": 12, "int": 5, "term": 5}


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    with one_thread():
        yield


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model, its draft heads and a prefix long enough for a prefill to take a moment."""
    root = tmp_path_factory.mktemp("faults")
    build_tiny_folder(root / "tiny")
    save_tiny_heads(root / "tiny", root / "heads.safetensors")
    (root / "prefix.txt").write_text(PREFIX * 8, encoding="utf-8")
    return root


def write_args(folder: Path) -> tuple[str, ...]:
    return (
        "-p", str(folder / "prefix.txt"), "-n", str(TOKENS), "-m", str(folder / "tiny"),
        "--heads", str(folder / "heads.safetensors"), "--checkpoint-every", str(EVERY), "--threads", "1", "-q",
    )  # fmt: skip


@pytest.fixture(scope="module")
def sweep(folder: Path) -> Iterator[tuple[Any, Any]]:
    """The launcher of `tokenswift` processes, and the sweep's settings with the uninterrupted text."""
    launcher = faults.Launcher()
    try:
        text, seconds = faults.reference(launcher, write_args(folder), folder)
        yield launcher, faults.Sweep(write_args(folder), text, seconds)
    finally:
        launcher.close()


@pytest.mark.parametrize("sig", sorted(TRIALS))
def test_stopped_at_random_moments_a_run_resumes_to_the_same_text(
    sweep: tuple[Any, Any], tmp_path: Path, sig: str
) -> None:
    launcher, config = sweep
    seed = {"kill": 1000, "int": 2000, "term": 3000}[sig]
    # Every trial stops a run at least once: one whose runs all ended before their stops writes another.
    stopping = dataclasses.replace(config, sig=sig, min_kills=1, attempts=10)
    trials = faults.sweep(launcher, stopping, trials=TRIALS[sig], seed=seed, root=tmp_path)
    totals = faults.summary(trials)
    print(sig, totals)
    failed = [f"trial {t.index} (seed {t.seed}): {t.failure}; kills {t.kills}" for t in trials if t.failure]
    assert not failed, "\n".join(failed)
    assert totals["identical"] == TRIALS[sig] and totals["kills"] >= TRIALS[sig], (totals, [t.kills for t in trials])


def test_stopped_before_its_first_checkpoint_and_marked_failed_a_run_resumes(
    sweep: tuple[Any, Any], folder: Path, tmp_path: Path
) -> None:
    """Issue 23: killed after its settings, before text.txt and any checkpoint; an old resume marked it failed."""
    _, config = sweep
    runs_dir = tmp_path / "runs"
    assert cli("write", *write_args(folder), "--runs-dir", runs_dir).exit_code == 0
    run = runs_dir / "run-001"
    shutil.rmtree(run / "checkpoint")
    (run / "text.txt").unlink()
    (run / "status.json").write_text(json.dumps({"state": "failed", "error": "No such file or directory: text.txt"}))
    assert json.loads(cli("runs", "--runs-dir", runs_dir, "--json").stdout)[0]["resumable"]
    assert "no checkpoint yet" in cli("runs", "show", "1", "--runs-dir", runs_dir).stdout
    resumed = cli("resume", "1", "--runs-dir", runs_dir, "-q", "--threads", "1")
    assert resumed.exit_code == 0, resumed.output
    assert resumed.stdout_bytes == (run / "text.txt").read_bytes() == config.reference


def test_stopped_after_its_last_checkpoint_a_run_is_recorded_done(
    sweep: tuple[Any, Any], folder: Path, tmp_path: Path
) -> None:
    _, config = sweep
    runs_dir = tmp_path / "runs"
    assert cli("write", *write_args(folder), "--runs-dir", runs_dir).exit_code == 0
    run = runs_dir / "run-001"
    (run / "status.json").write_text(json.dumps({"state": "running"}))  # killed before it recorded "done"
    listed = json.loads(cli("runs", "--runs-dir", runs_dir, "--json").stdout)[0]
    assert (listed["state"], listed["resumable"]) == ("interrupted", True)
    resumed = cli("resume", "1", "--runs-dir", runs_dir)
    assert resumed.exit_code == 0 and resumed.stdout == "" and "recorded as done" in resumed.stderr, resumed.output
    assert json.loads((run / "status.json").read_text())["state"] == "done"
    assert (run / "text.txt").read_bytes() == config.reference
    assert "complete" in cli("resume", "1", "--runs-dir", runs_dir).stderr


# ---- checkpoint writes that fail ----


def _failing_writes(mode: str, at: int) -> Callable[..., None]:
    """A `write_atomic` that fails (as `mode` says) from the `at`-th checkpoint on."""
    real, seen = durable.write_atomic, {"seq": 0}

    def write(path: Path, data: bytes) -> None:
        if path.name.startswith(("kv-", "state-")):  # kv-000003.safetensors, kv-000003-1..., state-000003...
            seen["seq"] = int(path.name.split("-")[1].split(".")[0])
        failing = path.parent.name == checkpoint.FOLDER and seen["seq"] >= at
        if not failing or mode == "after-rename" and path.name != checkpoint.MANIFEST:
            return real(path, data)
        if mode == "no-space" and path.name.startswith("state-"):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        if mode == "unwritable":
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        if mode == "truncated" and path.name.startswith("kv-"):
            path.write_bytes(data[: len(data) // 2])  # a torn write, as a full disk leaves one
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        if mode == "manifest" and path.name == checkpoint.MANIFEST:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        real(path, data)
        if mode == "after-rename":  # Ctrl-C twice, right after the new manifest's rename
            raise KeyboardInterrupt

    return write


@pytest.mark.parametrize(
    ("mode", "at"),
    [("no-space", 3), ("unwritable", 3), ("truncated", 3), ("manifest", 3), ("no-space", 1), ("after-rename", 3)],
)
def test_a_failed_checkpoint_write_keeps_the_previous_one_and_the_run_resumes(
    sweep: tuple[Any, Any], folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str, at: int
) -> None:
    _, config = sweep
    runs_dir = tmp_path / "runs"
    failing = _failing_writes(mode, at)
    monkeypatch.setattr(checkpoint, "write_atomic", failing)
    monkeypatch.setattr(durable, "write_atomic", failing)
    stopped = cli("write", *write_args(folder), "--runs-dir", runs_dir)
    monkeypatch.undo()
    run = runs_dir / "run-001"
    if mode == "after-rename":
        assert stopped.exit_code == 128 + signal.SIGINT, stopped.output
    else:
        assert stopped.exit_code == 1 and "cannot write a checkpoint" in stopped.stderr, stopped.output
        assert ("stays valid" in stopped.stderr) == (at > 1), stopped.stderr
        assert json.loads((run / "status.json").read_text())["state"] == "failed"
    assert not any(p.name.endswith(".tmp") for p in (run / "checkpoint").iterdir())
    listed = json.loads(cli("runs", "--runs-dir", runs_dir, "--json").stdout)
    assert listed[0]["resumable"], listed
    shown = cli("runs", "show", "1", "--runs-dir", runs_dir).stdout
    assert ("no checkpoint yet" in shown) == (at == 1), shown
    assert "resume  yes: tokenswift resume run-001" in shown
    resumed = cli("resume", "1", "--runs-dir", runs_dir, "-q", "--threads", "1")
    assert resumed.exit_code == 0, resumed.output
    assert (run / "text.txt").read_bytes() == config.reference


# ---- the lock, folders stopped while being created ----


def test_a_live_lock_refuses_with_its_pid_and_a_dead_ones_is_taken_over(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "run-001"
    run.mkdir(parents=True)
    holder = subprocess.Popen(
        [sys.executable, "-c", f"from tokenswift_cli.runs.durable import RunLock\nwith RunLock(__import__('pathlib')"
         f".Path({str(run)!r})):\n    print('held', flush=True)\n    __import__('time').sleep(600)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        refused = cli("resume", "1", "--runs-dir", tmp_path / "runs")
        assert refused.exit_code == 2 and f"another process (pid {holder.pid})" in refused.stderr, refused.output
        assert json.loads(cli("runs", "--runs-dir", tmp_path / "runs", "--json").stdout)[0]["state"] == "running"
    finally:
        holder.kill()
        holder.wait()
    with RunLock(run):  # the kernel dropped the dead process's lock
        assert (run / "lock").read_text() == str(os.getpid())


# A `tokenswift` command whose every start of another program is recorded, with the run locks it held then.
_WATCHED = """
import atexit, json, os, subprocess, sys
from pathlib import Path

starts, real = [], subprocess.Popen.__init__

def run_locks():
    held = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = Path(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            continue
        if target.name == "lock" and target.parent.name.startswith("run-"):
            held.append(str(target))
    return held

def watched(self, args, *rest, **options):
    starts.append({"program": str(args), "run_locks": run_locks()})
    return real(self, args, *rest, **options)

subprocess.Popen.__init__ = watched
atexit.register(lambda: Path(os.environ["STARTS"]).write_text(json.dumps(starts)))
sys.argv = ["tokenswift", *sys.argv[1:]]
from tokenswift_cli.cli.app import main
main()
"""


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="reads the process's open files in /proc")
def test_no_program_starts_while_a_run_is_locked(folder: Path, tmp_path: Path) -> None:
    """A program started while a run's lock is held holds the lock too until it execs: a resume killed
    in that moment (loading the kernels: ldconfig, c++, ninja) left its run looking like it was running
    (CI, 2026-11-28)."""
    runs_dir, log = tmp_path / "runs", tmp_path / "starts.json"
    commands = (  # dense weights: the kernels load at the first forward (4-bit ones load them with the model)
        ["write", *write_args(folder), "--weights", "dense", "--runs-dir", str(runs_dir)],
        ["resume", "1", "--tokens", str(TOKENS + 8), "--runs-dir", str(runs_dir), "--threads", "1", "-q"],
    )
    for command in commands:
        done = subprocess.run(
            [sys.executable, "-c", _WATCHED, *command], env={**os.environ, "STARTS": str(log)},
            capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        starts = json.loads(log.read_text())
        assert starts, f"{command[0]} started no program: nothing was watched"
        assert not [s for s in starts if s["run_locks"]], (command[0], starts)


def test_a_folder_stopped_while_being_created_is_listed_to_remove(tmp_path: Path) -> None:
    runs_dir = tmp_path / "runs"
    (runs_dir / "run-001").mkdir(parents=True)  # killed right after its mkdir
    (runs_dir / "run-002").mkdir()  # killed while writing its settings
    (runs_dir / "run-002" / "prefix.txt").write_text(PREFIX)
    (runs_dir / "run-002" / ".settings.json.tmp").write_text("{")
    (runs_dir / "run-003").mkdir()
    (runs_dir / "run-003" / "settings.json").write_text("{")  # damaged by hand
    listing = cli("runs", "--runs-dir", runs_dir)
    assert listing.exit_code == 0, listing.output
    assert listing.stdout.count("incomplete") == 3 and "tokenswift runs rm run-002" in listing.stdout
    shown = cli("runs", "show", "run-002", "--runs-dir", runs_dir)
    assert shown.exit_code == 0 and "prefix.txt" in shown.stdout and "no settings" in shown.stdout, shown.output
    refused = cli("resume", "2", "--runs-dir", runs_dir)
    assert refused.exit_code == 2 and "run-002 has no settings" in refused.stderr, refused.output
    assert "cannot be read" in cli("resume", "3", "--runs-dir", runs_dir).stderr
    for name in ("run-001", "run-002", "run-003"):
        assert cli("runs", "rm", name, "--yes", "--runs-dir", runs_dir).exit_code == 0
    assert not any(runs_dir.iterdir())


def test_a_build_lock_left_by_a_killed_load_is_taken_over() -> None:
    """torch's build lock stays behind a process killed while loading the kernels; the next load goes on."""
    from tokenswift_cli.backends.cpu import kernels

    if not kernels.available():
        pytest.skip("the C++ kernels do not compile here")
    stale = kernels.build_dir() / "lock"
    stale.touch()
    try:
        loading = threading.Thread(target=kernels.load.__wrapped__, daemon=True)
        loading.start()
        loading.join(600)  # a safety net, not a measure: the load returns at once once it takes the lock over
        assert not loading.is_alive(), f"the load still waits after 600 s; the stale lock exists: {stale.exists()}"
        assert not stale.exists()
    finally:
        stale.unlink(missing_ok=True)  # never leave it to hang the next load
