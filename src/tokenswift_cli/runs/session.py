"""One run in progress: the step loop with its text output, checkpoints and stop signals.

`Session.drive` generates to the target or to a stop request (SIGINT/SIGTERM: finish the step; a
closed stdout), checkpoints, records the run's state and returns the exit code.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO, Any

from tokenswift_cli.config import RunConfig
from tokenswift_cli.engine.decode import generate
from tokenswift_cli.engine.state import GenerationState
from tokenswift_cli.model.heads import DraftHeads
from tokenswift_cli.model.target import Target
from tokenswift_cli.runs import store as runs
from tokenswift_cli.runs.checkpoint import Checkpointer, CheckpointError
from tokenswift_cli.runs.drafts import DraftFigures, describe
from tokenswift_cli.runs.progress import Progress, Renderer
from tokenswift_cli.runs.stops import StopMatcher
from tokenswift_cli.runs.textstream import TextStream

SIGPIPE_EXIT = 141


class RunFailed(Exception):
    """Generation stopped on a runtime failure (exit code 1); the message is one line."""


class TextSink:
    """Writes each chunk to text.txt, --out and stdout (or the panel, when it shows the text)."""

    def __init__(
        self,
        path: Path,
        *,
        keep_bytes: int | None,
        out: Path | None,
        echo: Callable[[str], None] | None,
        out_mirrors: bool = False,
    ) -> None:
        self.file: IO[bytes]
        if keep_bytes is None:
            self.file = path.open("wb")
        else:
            # A run stopped before its first checkpoint may have no text.txt yet: create it.
            self.file = os.fdopen(os.open(path, os.O_RDWR | os.O_CREAT, 0o644), "r+b")
            self.file.truncate(keep_bytes)
            self.file.seek(keep_bytes)
        self.out = _open_out(out, path, keep_bytes, mirrors=out_mirrors) if out is not None else None
        self.echo = echo
        self.stdout: IO[bytes] | None = None if echo else sys.stdout.buffer
        self.broken = False  # stdout's reader went away
        sys.stdout.flush()

    @property
    def bytes(self) -> int:
        return self.file.tell()

    def write(self, text: str) -> None:
        if not text:
            return
        data = text.encode("utf-8", errors="replace")
        self.file.write(data)
        self.file.flush()
        if self.out is not None:
            self.out.write(data)
            self.out.flush()
        if self.echo is not None:
            self.echo(text)
        elif self.stdout is not None and not self.broken:
            try:
                self.stdout.write(data)
                self.stdout.flush()
            except BrokenPipeError:
                self._stdout_closed()

    def _stdout_closed(self) -> None:
        self.broken = True
        # Later flushes (at exit too) must not raise again: point stdout at /dev/null.
        with contextlib.suppress(OSError, ValueError, AttributeError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())

    def sync(self) -> None:
        self.file.flush()
        os.fsync(self.file.fileno())

    def close(self) -> None:
        self.file.close()
        if self.out is not None:
            self.out.close()


def _open_out(out: Path, text: Path, keep_bytes: int | None, *, mirrors: bool) -> IO[bytes]:
    """--out for writing. A resumed run's own --out file (`mirrors`) holds its text: it continues from
    the checkpoint, as text.txt does; another file gets only the new text, appended."""
    if keep_bytes is None:
        return out.open("wb")
    if not mirrors:
        return out.open("ab")
    if out.exists() and out.stat().st_size >= keep_bytes:
        file = out.open("r+b")
        file.truncate(keep_bytes)
        file.seek(keep_bytes)
        return file
    file = out.open("wb")  # missing or cut short: written again from the run's own text
    with text.open("rb") as source:
        file.write(source.read(keep_bytes))
    return file


class StopSignals:
    """SIGINT/SIGTERM: the first asks to stop after the current step, a second one stops at once."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._old: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        with contextlib.suppress(ValueError):  # not the main thread: no handlers, Ctrl-C as usual
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is not None:
            raise KeyboardInterrupt
        self.signum = signum

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)


def _kv_bytes(state: GenerationState) -> int:
    layers = state.full.layer_list
    keys = layers[0].keys
    if keys is None:
        return 0
    return 2 * len(layers) * keys.shape[1] * keys.shape[-1] * keys.element_size() * state.full.layer_list[0].stored


@dataclass
class Session:
    """A run between its start (prefill or restore) and its end: generate, stream, checkpoint, stop."""

    run_dir: Path
    cfg: RunConfig
    target: Target
    heads: DraftHeads | None
    eos_ids: tuple[int, ...]
    state: GenerationState
    stream: TextStream
    sink: TextSink
    checkpointer: Checkpointer
    renderer: Renderer
    every: int
    resume_hint: str
    stops: StopMatcher = field(default_factory=lambda: StopMatcher(()))
    fresh: bool = False  # started by this process (`write`), not resumed: nothing in its folder predates it

    def emit(self, tokens: Sequence[int]) -> None:
        text, ended = self.stops.cut(self.stream.push(tokens))
        self.sink.write(text)
        if ended:  # the run is complete, as at an end-of-sequence token (recorded in the checkpoint)
            self.state.eos_seen = True

    def progress(self) -> Progress:
        stats = self.state.stats
        saved = self.checkpointer.manifest
        return Progress(
            run_id=self.run_dir.name,
            generated=stats.generated,
            target=self.cfg.max_new_tokens,
            decode_seconds=stats.decode_seconds,
            drafts=DraftFigures.of(stats, self.cfg),
            context=self.state.full.length,
            kv_bytes=_kv_bytes(self.state),
            last_checkpoint=saved["state"]["emitted"] if saved else None,
        )

    def checkpoint(self) -> None:
        with self.state.stats.phase("checkpoint"):  # the run's own costs are timed beside the engine's
            self.sink.sync()  # the text the manifest counts must be on disk before it
            self.checkpointer.save(self.state, stream=self.stream.state, text_bytes=self.sink.bytes)
        self.renderer.checkpointed(self.state.stats.generated)

    def drive(self, stop: StopSignals) -> int:
        """Generate to the target or a stop request; checkpoint; return the exit code."""
        last = self.state.stats.generated
        try:
            if self.checkpointer.manifest is None:
                self.checkpoint()  # the prefix's keys/values first: a resume never prefills again
            if stop.signum is None and not self.state.finished(self.cfg):
                events = generate(self.target, self.heads, self.state, self.cfg, eos_ids=self.eos_ids)
                for event in events:
                    with self.state.stats.phase("output"):
                        self.emit(event.tokens)
                    with self.state.stats.phase("panel"):
                        self.renderer.update(self.progress())
                    if stop.signum is not None or self.sink.broken:
                        break
                    if self.state.stats.generated - last >= self.every:
                        self.checkpoint()
                        last = self.state.stats.generated
            if stop.signum is not None:
                self.renderer.note(f"{self.run_dir.name}: stopping after this step; writing a checkpoint")
            elif self._a_preview():
                return self._discard()
            self.checkpoint()
        except KeyboardInterrupt:
            self._finish("interrupted")
            saved = self.checkpointer.manifest
            kept = saved["state"]["emitted"] if saved else 0
            print(f"stopped at once: the checkpoint keeps {kept} tokens", file=sys.stderr)
            print(self.resume_hint, file=sys.stderr)
            return 128 + signal.SIGINT
        except (CheckpointError, OSError) as error:
            message = (
                str(error) if isinstance(error, CheckpointError) else f"{error.strerror or error}: {error.filename}"
            )
            self._finish("failed", message)
            raise RunFailed(message) from error
        if self.state.finished(self.cfg):
            self._finish("done")
            return 0
        self._finish("interrupted")
        print(("stdout was closed; " if self.sink.broken else "") + self.resume_hint, file=sys.stderr)
        return SIGPIPE_EXIT if stop.signum is None else 128 + stop.signum

    def _a_preview(self) -> bool:
        """stdout's reader left (`| head`) before the first checkpoint past the prefix, and no --out file
        wants the rest: the reader has seen all the run holds, and a resume would start from the prefix."""
        saved = self.checkpointer.manifest
        emitted = saved["state"]["emitted"] if saved else 0
        return self.fresh and self.sink.broken and self.sink.out is None and emitted == 0

    def _discard(self) -> int:
        """Remove the run's folder: a preview leaves no run behind to list, resume or remove."""
        self.sink.close()
        self.renderer.close()
        runs.discard_run(self.run_dir)
        print(
            f"stdout was closed after {self.state.stats.generated} tokens, before the first checkpoint: "
            f"{self.run_dir.name} was not kept",
            file=sys.stderr,
        )
        return SIGPIPE_EXIT

    def _finish(self, state: runs.RunState, error: str | None = None) -> None:
        with contextlib.suppress(OSError):  # a full disk must not hide the original error
            runs.set_status(self.run_dir, state, error)
        self.sink.close()
        stats = self.state.stats
        self.renderer.update(self.progress())  # the panel's last frame shows the last checkpoint
        if state == "done":
            drafts = describe(DraftFigures.of(stats, self.cfg), sep=", ")
            self.renderer.note(
                f"{self.run_dir.name} done: {stats.generated} tokens in {stats.decode_seconds:.1f} s "
                f"({stats.tokens_per_second:.1f} tok/s), drafts {drafts}; text in {self.run_dir / runs.TEXT}"
            )
        self.renderer.close()
