"""What a run shows on stderr: a Rich live panel on a terminal, short log lines otherwise, nothing with
--quiet. Presentation only: the runner hands over `Progress` snapshots (runs/progress.py) and never
formats anything; the command creates the renderer and passes it to the runner.

stdout carries the generated text alone. When stdout is the same terminal as the panel, the panel
prints the text above itself line by line (raw writes would be overdrawn by the panel's refreshes).
"""

from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Callable
from typing import IO

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.panel import Panel
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from tokenswift_cli.runs.drafts import DraftFigures, describe
from tokenswift_cli.runs.progress import Progress, QuietRenderer, Renderer

Clock = Callable[[], float]


class RateMeter:
    """Tokens per second over the last `window` seconds (the panel's "now")."""

    def __init__(self, window: float = 5.0, clock: Clock = time.monotonic) -> None:
        self.window, self.clock = window, clock
        self.samples: deque[tuple[float, int]] = deque()

    def add(self, generated: int) -> None:
        now = self.clock()
        self.samples.append((now, generated))
        while len(self.samples) > 2 and now - self.samples[1][0] >= self.window:
            self.samples.popleft()

    @property
    def rate(self) -> float:
        if len(self.samples) < 2:
            return 0.0
        (t0, n0), (t1, n1) = self.samples[0], self.samples[-1]
        return (n1 - n0) / (t1 - t0) if t1 > t0 else 0.0


class DraftMeter:
    """Whether the steps of the last `window` seconds drafted: the tuner's choice now, which the run's
    totals hide once it has drafted at all."""

    def __init__(self, window: float = 5.0, clock: Clock = time.monotonic) -> None:
        self.window, self.clock = window, clock
        self.samples: deque[tuple[float, int, int | None]] = deque()

    def add(self, drafts: DraftFigures) -> None:
        now = self.clock()
        self.samples.append((now, drafts.steps, drafts.drafted_steps))
        while len(self.samples) > 2 and now - self.samples[1][0] >= self.window:
            self.samples.popleft()

    @property
    def drafting_now(self) -> bool | None:
        """True: some recent step drafted; False: none did; None: no step yet, or the count is unknown."""
        if len(self.samples) < 2:
            return None
        (_, steps0, drafted0), (_, steps1, drafted1) = self.samples[0], self.samples[-1]
        if steps1 == steps0 or drafted0 is None or drafted1 is None:
            return None
        return drafted1 > drafted0


def format_duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m {seconds % 60:02d}s"
    return f"{seconds // 3600}h {seconds // 60 % 60:02d}m"


def format_bytes(count: int) -> str:
    value = float(count)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    raise AssertionError("unreachable")


def average_rate(p: Progress) -> float:
    return p.generated / p.decode_seconds if p.decode_seconds > 0 else 0.0


def eta(p: Progress, rate: float) -> str:
    remaining = max(0, p.target - p.generated)
    if remaining == 0:
        return "0s"
    return format_duration(remaining / rate) if rate > 0 else "?"


def log_line(p: Progress, now_rate: float, drafting_now: bool | None = None) -> str:
    """One plain line (no escape codes) for logs."""
    percent = 100 * p.generated / p.target if p.target else 100
    return (
        f"{p.run_id}: {p.generated}/{p.target} tokens ({percent:.0f}%), {now_rate:.1f} tok/s now, "
        f"{average_rate(p):.1f} average, drafts {describe(p.drafts, drafting_now=drafting_now, sep=', ')}, "
        f"context {p.context}, eta {eta(p, now_rate or average_rate(p))}"
    )


def panel(
    p: Progress,
    now_rate: float,
    *,
    title: str = "",
    checkpoint_age: float | None = None,
    drafting_now: bool | None = None,
) -> RenderableType:
    """The live panel for one snapshot (pure: tested by rendering it to a string)."""
    avg = average_rate(p)
    bar = Table.grid(padding=(0, 1))
    bar.add_row(
        ProgressBar(total=max(p.target, 1), completed=min(p.generated, p.target), width=40),
        Text(f"{p.generated:,} / {p.target:,}"),
        Text(f"{100 * p.generated / max(p.target, 1):.0f}%"),
        Text(f"ETA {eta(p, now_rate or avg)}"),
    )
    rows = Table.grid(padding=(0, 2))
    rows.add_column(style="bold")
    rows.add_row("speed", f"{now_rate:.1f} tok/s now · {avg:.1f} tok/s average")
    rows.add_row("drafts", describe(p.drafts, drafting_now=drafting_now))
    rows.add_row("context", f"{p.context:,} tokens · KV cache {format_bytes(p.kv_bytes)}")
    if p.last_checkpoint is None:
        saved = "no checkpoint yet"
    else:
        age = f" ({format_duration(checkpoint_age)} ago)" if checkpoint_age is not None else ""
        saved = f"checkpoint at {p.last_checkpoint:,} tokens{age}"
    rows.add_row("saved", saved)
    return Panel(Group(bar, rows), title=title or f"tokenswift · {p.run_id}", title_align="left", expand=False)


class LogRenderer(QuietRenderer):
    """stderr is not a terminal: a plain line every `interval` seconds, and each note."""

    def __init__(self, stream: IO[str], *, interval: float = 15.0, clock: Clock = time.monotonic) -> None:
        self.stream, self.interval, self.clock = stream, interval, clock
        self.meter, self.drafts = RateMeter(clock=clock), DraftMeter(clock=clock)
        self.last_line: float | None = None
        self.progress: Progress | None = None

    def _print(self, line: str) -> None:
        print(line, file=self.stream, flush=True)

    def update(self, progress: Progress) -> None:
        self.progress = progress
        self.meter.add(progress.generated)
        self.drafts.add(progress.drafts)
        now = self.clock()
        if self.last_line is None:
            self.last_line = now
        elif now - self.last_line >= self.interval:
            self.last_line = now
            self._print(log_line(progress, self.meter.rate, self.drafts.drafting_now))

    def note(self, message: str) -> None:
        self._print(message)


class LivePanel(QuietRenderer):
    """stderr is a terminal: a panel redrawn a few times per second."""

    def __init__(self, console: Console, *, takes_text: bool, clock: Clock = time.monotonic) -> None:
        self.console, self.takes_text, self.clock = console, takes_text, clock
        self.meter, self.drafts = RateMeter(clock=clock), DraftMeter(clock=clock)
        self.progress: Progress | None = None
        self.title = ""
        self.checkpoint_time: float | None = None
        self.pending = ""  # the text's unfinished last line, shown under the panel
        # Anything else written to the panel's terminal while it shows (a library's warning on sys.stderr,
        # a print on stdout when the text goes through the panel) must go above it through the console:
        # written past it, it shifts the panel down a line, the next redraw erases the wrong lines, and
        # the text line above the panel stays on screen twice.
        self.live = Live(
            console=console, refresh_per_second=4, redirect_stdout=takes_text, redirect_stderr=True, transient=False,
            get_renderable=self._renderable,
        )  # fmt: skip

    def _renderable(self) -> RenderableType:
        if self.progress is None:
            return Text(f"{self.title} starting…")
        age = self.clock() - self.checkpoint_time if self.checkpoint_time is not None else None
        view = panel(
            self.progress, self.meter.rate, title=self.title, checkpoint_age=age, drafting_now=self.drafts.drafting_now
        )
        if self.takes_text and self.pending:
            return Group(Text(self.pending), view)  # at most one line: `text` printed the others above
        return view

    def start(self, title: str) -> None:
        self.title = title
        self.live.start()

    def update(self, progress: Progress) -> None:
        self.progress = progress
        self.meter.add(progress.generated)
        self.drafts.add(progress.drafts)

    def checkpointed(self, generated: int) -> None:
        self.checkpoint_time = self.clock()

    def note(self, message: str) -> None:
        self._end_line()  # a note never lands inside the text, nor before its last line
        self.console.print(message, markup=False, highlight=False)

    def text(self, chunk: str) -> None:
        """Whole screen lines go above the panel, where they stay; the line being written shows just above it."""
        lines = (self.pending + chunk).split("\n")
        self.pending = lines.pop()
        for line in lines:
            self._print(line)
        wrapped = Text(self.pending).wrap(self.console, self.console.width)
        if len(wrapped) > 1:
            for screen_line in wrapped[:-1]:
                self._print(screen_line.plain.rstrip())
            self.pending = wrapped[-1].plain

    def _print(self, line: str) -> None:
        self.console.print(line, markup=False, highlight=False, emoji=False, soft_wrap=True)

    def _end_line(self) -> None:
        if self.takes_text and self.pending:
            self._print(self.pending)
            self.pending = ""

    def close(self) -> None:
        self._end_line()
        self.live.stop()


def make_renderer(*, quiet: bool, stderr: IO[str] | None = None, stdout: IO[str] | None = None) -> Renderer:
    """Quiet, a live panel when stderr is a terminal, plain log lines otherwise."""
    stderr = stderr or sys.stderr
    stdout = stdout or sys.stdout
    if quiet:
        return QuietRenderer()
    if stderr.isatty():
        return LivePanel(Console(file=stderr), takes_text=stdout.isatty())
    return LogRenderer(stderr)
