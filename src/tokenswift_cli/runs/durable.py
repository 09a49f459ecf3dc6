"""Durable run files: writes that a crash never leaves half done, and the lock against two writers.

Used by checkpoints and by the run folder's settings and status files.
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path
from typing import Any

LOCK = "lock"


class CheckpointError(Exception):
    """A checkpoint cannot be written or used; the message is one line meant for the user."""


def fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes) -> None:
    """Write `data` to a temporary file, fsync it, then rename it over `path`."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with tmp.open("wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    write_atomic(path, (json.dumps(data, indent=1, sort_keys=True) + "\n").encode())


class RunLock:
    """An exclusive `flock` on `run-NNN/lock` for as long as a process writes the run.

    The kernel drops it when the process dies, `kill -9` included, so a stale lock never blocks.
    """

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self._fd: int | None = None

    def __enter__(self) -> RunLock:
        fd = os.open(self.run_dir / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = os.read(fd, 32).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise CheckpointError(f"{self.run_dir.name} is being written by another process (pid {pid})") from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            os.close(self._fd)  # releases the flock
            self._fd = None


def is_locked(run_dir: Path) -> bool:
    """True while some process holds the run's lock."""
    path = run_dir / LOCK
    if not path.exists():
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False
