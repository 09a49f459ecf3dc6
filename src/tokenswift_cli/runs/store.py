"""Run directories `run-NNN/` under the runs folder: creation, lookup, listing, state, removal.

A run directory holds `settings.json` (the full settings, model and heads with their fingerprints),
`prefix.txt`, `text.txt` (the text so far, for humans), `status.json`, the `lock` and the
`checkpoint/` folder. No torch here: `tokenswift runs` is instant.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from tokenswift_cli.paths import home_dir
from tokenswift_cli.runs.checkpoint import CheckpointError, read_manifest
from tokenswift_cli.runs.drafts import DraftFigures
from tokenswift_cli.runs.durable import LOCK, is_locked, write_json_atomic

# "incomplete": a folder without readable settings (stopped while being created): nothing to resume.
RunState = Literal["running", "interrupted", "done", "failed", "incomplete"]
SETTINGS = "settings.json"
STATUS = "status.json"
PREFIX = "prefix.txt"
TEXT = "text.txt"
_NAME = re.compile(r"run-(\d+)")


class RunError(Exception):
    """A run cannot be found, created or changed; the message is one line meant for the user."""


def runs_root(runs_dir: Path | None = None) -> Path:
    return runs_dir.expanduser().absolute() if runs_dir is not None else home_dir() / "runs"


def run_name(number: int) -> str:
    return f"run-{number:03d}"


def _numbers(root: Path) -> list[int]:
    if not root.is_dir():
        return []
    return sorted(int(m.group(1)) for p in root.iterdir() if (m := _NAME.fullmatch(p.name)) and p.is_dir())


def ensure_writable(root: Path) -> None:
    """Create the runs folder if needed and make sure files can be created in it."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe = root / f".probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as error:
        raise RunError(f"the runs folder {root} is not writable ({error.strerror or error})") from None


def create_run(root: Path) -> Path:
    """A new, empty `run-NNN` with the next free number (safe against concurrent creators)."""
    number = (_numbers(root) or [0])[-1] + 1
    while True:
        path = root / run_name(number)
        try:
            path.mkdir()
            return path
        except FileExistsError:
            number += 1
        except OSError as error:
            raise RunError(f"cannot create {path} ({error.strerror or error})") from None


def resolve_run(root: Path, name: str) -> Path:
    """`run-042`, `42` or a run folder's path (an incomplete one too: `runs show` and `runs rm` take it)."""
    candidate = Path(name).expanduser()
    if (candidate / SETTINGS).is_file():
        return candidate.absolute()
    digits = name.removeprefix("run-")
    path = root / (run_name(int(digits)) if digits.isdigit() else name)
    if path.is_dir() and _NAME.fullmatch(path.name):
        return path
    if candidate.is_dir() and _NAME.fullmatch(candidate.name):
        return candidate.absolute()
    raise RunError(f"no run named {name!r} in {root} (see `tokenswift runs`)")


def write_settings(run_dir: Path, settings: dict[str, Any]) -> None:
    write_json_atomic(run_dir / SETTINGS, settings)


def read_settings(run_dir: Path) -> dict[str, Any]:
    if not (run_dir / SETTINGS).exists():
        raise RunError(
            f"{run_dir.name} has no settings: it stopped while being created, before anything could be "
            f"resumed; remove it with `tokenswift runs rm {run_dir.name}`"
        )
    try:
        data = json.loads((run_dir / SETTINGS).read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise RunError(f"the settings of {run_dir.name} cannot be read ({error})") from None
    if not isinstance(data, dict) or "run_config" not in data or "model" not in data:
        raise RunError(f"the settings of {run_dir.name} are incomplete")
    return data


def set_status(run_dir: Path, state: RunState, error: str | None = None) -> None:
    now = datetime.now(UTC).isoformat(timespec="seconds")
    write_json_atomic(run_dir / STATUS, {"state": state, "error": error, "updated": now, "pid": os.getpid()})


def _status(run_dir: Path) -> dict[str, Any]:
    try:
        data = json.loads((run_dir / STATUS).read_text(encoding="utf-8"))
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def recorded_device(run_dir: Path) -> str | None:
    """The device type a run recorded (None: none, or settings that cannot be read)."""
    try:
        device = read_settings(run_dir).get("device")
    except RunError:
        return None
    return device.get("type") if isinstance(device, dict) else None


def recorded_state(run_dir: Path) -> str | None:
    """The state its last writer recorded in status.json (None: none), whether or not it still runs."""
    state = _status(run_dir).get("state")
    return state if isinstance(state, str) else None


def run_state(run_dir: Path) -> RunState:
    """running while a process holds the lock; a run whose writer died without saying so is interrupted."""
    if is_locked(run_dir):
        return "running"
    if not (run_dir / SETTINGS).is_file():
        return "incomplete"
    state = recorded_state(run_dir)
    return "done" if state == "done" else "failed" if state == "failed" else "interrupted"


@dataclass(frozen=True)
class RunInfo:
    id: str
    path: Path
    state: RunState
    created: str
    model: str
    generated: int
    target: int
    seconds: float
    tokens_per_second: float
    alpha: float
    mean_accepted: float
    error: str | None = None
    resumable: bool = False  # what is on disk lets `tokenswift resume` continue it (failed runs too)
    subject: str = ""  # what the run writes: "prompt: " and the request, or "prefix: " and the text's start
    out: str | None = None  # its --out file
    drafts: DraftFigures | None = None  # how it drafted (None: incomplete)

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "path": str(self.path), "drafts": asdict(self.drafts) if self.drafts else None}


def _manifest(run_dir: Path) -> dict[str, Any] | None:
    try:
        return read_manifest(run_dir)
    except CheckpointError:
        return None


def resume_blocker(run_dir: Path, state: RunState) -> str | None:
    """Why `tokenswift resume` would not continue this run, from what is on disk; None: it would.

    A failed run counts as any stopped one: its checkpoint (or, before the first one, its settings
    and prefix) is what a resume starts from. No torch and no checksums of the KV segments here.
    """
    if state == "running":
        return "it is running"
    if state == "done":
        return "it is complete (raise its target with --tokens)"
    if not (run_dir / PREFIX).is_file():
        return f"its {PREFIX} is missing"
    try:
        manifest = read_manifest(run_dir)
    except CheckpointError as error:
        return str(error)
    # A stopped run whose checkpoint is complete resumes too: the resume records it done.
    info = (manifest or {}).get("state", {})
    text = run_dir / TEXT
    if info.get("text_bytes", 0) > (text.stat().st_size if text.exists() else 0):
        return f"its {TEXT} is shorter than its checkpoint"
    return None


def _incomplete_info(run_dir: Path, error: str) -> RunInfo:
    created = datetime.fromtimestamp(run_dir.stat().st_mtime, UTC).isoformat(timespec="seconds")
    state: RunState = "running" if is_locked(run_dir) else "incomplete"
    return RunInfo(
        id=run_dir.name, path=run_dir, state=state, created=created, model="", generated=0, target=0, seconds=0.0,
        tokens_per_second=0.0, alpha=0.0, mean_accepted=0.0, error=error,
    )  # fmt: skip


def run_info(run_dir: Path) -> RunInfo:
    try:
        settings = read_settings(run_dir)
    except RunError as error:  # listed all the same, as something to remove
        return _incomplete_info(run_dir, str(error))
    stats = (_manifest(run_dir) or {}).get("state", {}).get("stats", {})
    state = run_state(run_dir)
    seconds = sum(v for k, v in stats.get("seconds", {}).items() if k != "prefill")
    return RunInfo(
        id=run_dir.name,
        path=run_dir,
        state=state,
        created=settings.get("created", ""),
        model=settings["model"].get("label") or settings["model"]["spec"]["name"],
        generated=stats.get("generated", 0),
        target=settings["run_config"]["max_new_tokens"],
        seconds=seconds,
        tokens_per_second=stats.get("tokens_per_second", 0.0),
        alpha=stats.get("alpha", 0.0),
        mean_accepted=stats.get("mean_accepted", 0.0),
        error=_status(run_dir).get("error"),
        resumable=state in ("interrupted", "failed") and resume_blocker(run_dir, state) is None,
        subject=_subject(run_dir, settings),
        out=(settings.get("output") or {}).get("out"),
        drafts=DraftFigures.recorded(stats, settings["run_config"]),
    )


def _subject(run_dir: Path, settings: dict[str, Any], length: int = 200) -> str:
    """The request a run answers, or the start of the text it continues (`length` characters at most)."""
    request = settings.get("prefix", {}).get("request")
    if request is not None:
        return f"prompt: {request['prompt'][:length]}"
    try:
        with (run_dir / PREFIX).open("rb") as file:
            start = file.read(4 * length).decode("utf-8", errors="ignore")
    except OSError:
        return "prefix: (missing)"
    return f"prefix: {start[:length]}"


def _size(path: Path) -> int | None:
    return path.stat().st_size if path.is_file() else None


def _checkpoint_on_disk(run_dir: Path) -> tuple[dict[str, Any] | None, str | None]:
    """(the last checkpoint: sequence number, time, tokens, text bytes, files, bytes; why it is unusable)."""
    try:
        manifest = read_manifest(run_dir)
    except CheckpointError as error:
        return None, str(error)
    if manifest is None:
        return None, None
    info, files = manifest["state"], manifest["files"]
    return {
        "seq": manifest["seq"],
        "written_at": manifest["written_at"],
        "tokens": info["emitted"],
        "text_bytes": info["text_bytes"],
        "files": len(files),
        "bytes": sum(e["bytes"] for e in files),
    }, None


def run_report(run_dir: Path) -> dict[str, Any]:
    """Settings, statistics and what is on disk, as `tokenswift runs show --json` prints them."""
    info = run_info(run_dir)
    checkpoint, damage = _checkpoint_on_disk(run_dir)
    disk = {
        "files": sorted(p.name for p in run_dir.iterdir() if p.name != LOCK),
        "prefix_bytes": _size(run_dir / PREFIX),
        "text_bytes": _size(run_dir / TEXT),
        "checkpoint_error": damage,
    }
    report: dict[str, Any] = {
        "id": info.id, "path": str(info.path), "state": info.state, "error": _status(run_dir).get("error"),
        "resumable": info.resumable,
        "resume_blocker": info.error, "settings": None, "statistics": None, "checkpoint": checkpoint, "disk": disk,
    }  # fmt: skip
    try:
        settings = read_settings(run_dir)
    except RunError:  # incomplete: the report says so, and what the folder holds
        return report
    report["resume_blocker"] = resume_blocker(run_dir, info.state)
    stats = (_manifest(run_dir) or {}).get("state", {}).get("stats", {})
    report["settings"] = settings
    report["statistics"] = {
        "generated_tokens": info.generated,
        "target_tokens": info.target,
        "seconds": info.seconds,
        "prefill_seconds": stats.get("seconds", {}).get("prefill", 0.0),
        "tokens_per_second": info.tokens_per_second,
        "alpha": info.alpha,
        "beta": stats.get("beta", 0.0),
        "mean_accepted_length": info.mean_accepted,
        "iterations": stats.get("iterations", 0),
        "drafts": asdict(info.drafts) if info.drafts else None,  # drafts.describe says it in words
    }
    return report


def list_runs(root: Path) -> list[RunInfo]:
    return [run_info(root / run_name(number)) for number in _numbers(root)]


def discard_run(run_dir: Path) -> None:
    """Delete the folder of a run this process writes and holds the lock of (a preview cut short)."""
    shutil.rmtree(run_dir, ignore_errors=True)


def remove_run(root: Path, name: str) -> Path:
    """Delete a run directory; refuses a running one."""
    path = resolve_run(root, name)
    if is_locked(path):
        raise RunError(f"{path.name} is running; stop it first")
    shutil.rmtree(path)
    return path
