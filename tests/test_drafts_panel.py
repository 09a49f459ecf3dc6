"""The panel explains the drafts: off and why when the tuner runs plain steps, figures over stated spans
that agree with each other; and nothing written beside the live panel shows a text line twice."""

from __future__ import annotations

import io
import re
import sys
from types import SimpleNamespace

import pytest
from rich.console import Console
from test_render import SNAPSHOT, FakeClock, render

from tokenswift_cli.cli.panel import DraftMeter, LivePanel, LogRenderer, log_line, panel
from tokenswift_cli.config import DraftConfig, RunConfig
from tokenswift_cli.engine.decode import _count
from tokenswift_cli.engine.metrics import Stats
from tokenswift_cli.runs.drafts import DraftFigures, describe
from tokenswift_cli.runs.progress import Progress

OFF = DraftFigures("auto", steps=2000, drafted_steps=0, alpha=0.0, tokens_per_step=1.0, ngram_share=0.0)


def _with(drafts: DraftFigures) -> Progress:
    return Progress(**{**SNAPSHOT.__dict__, "drafts": drafts})


def test_drafts_off_say_so_and_why_in_the_panel_and_the_log_line() -> None:
    shown = render(panel(_with(OFF), 14.5))
    assert "drafts   off: plain steps are faster here · 1.00 tokens/step" in shown and "alpha" not in shown
    line = log_line(_with(OFF), 14.5)
    assert ", drafts off: plain steps are faster here, 1.00 tokens/step, context " in line
    plain = DraftFigures("plain", 2000, 0, 0.0, 1.0, 0.0)
    assert describe(plain) == "off (--mode plain) · 1.00 tokens/step"
    assert describe(DraftFigures("auto", 0, 0, 0.0, 0.0, 0.0)) == "no step yet"  # not "off": nothing was decided
    nothing = DraftFigures("fixed", 2000, 0, 0.0, 1.0, 0.0)  # e.g. --draft ngram --ngram-top-k 0 would: settings
    assert describe(nothing).startswith("off: the draft settings draft nothing")


def _stats(drafted: int, plain: int, *, slots: int = 4, accepted: int = 1) -> Stats:
    """Counted as the decode loop counts: `drafted` steps of `slots` slots accepting `accepted`, then plain steps."""
    stats = Stats()
    for index in range(drafted + plain):
        drafts = index < drafted
        took = accepted if drafts else 0
        step = SimpleNamespace(accepted=SimpleNamespace(tokens=[0] * took, from_ngram=0), tree=SimpleNamespace(size=1))
        _count(stats, step, [0] * (took + 1), slots=slots if drafts else 0)  # type: ignore[arg-type]
    return stats


def _numbers(text: str) -> list[float]:
    return [float(n) for n in re.findall(r"\d+\.\d+|\d+", text)]


def test_alpha_and_tokens_per_step_are_over_stated_spans_and_agree() -> None:
    """The long run's `alpha 0.25, 1.00 tokens/step`: alpha counts the slots of the few steps that drafted,
    tokens per step every step. Said with their spans, 1 + share x alpha x slots gives tokens per step."""
    stats = _stats(drafted=30, plain=1970)
    assert stats.alpha == 0.25 and stats.drafted_iterations == 30 and round(stats.mean_accepted, 2) == 1.01
    figures = DraftFigures.of(stats, RunConfig(max_new_tokens=2000, draft=DraftConfig().drafting("auto")))
    said = describe(figures)
    assert (
        said
        == "mostly off: plain steps are faster here · 1.5% of steps drafted, alpha 0.25 on those · 1.01 tokens/step"
    )
    share, alpha, per_step = _numbers(said)
    assert per_step == pytest.approx(1 + share / 100 * alpha * 4, abs=0.01)
    meter = DraftMeter(clock=FakeClock())
    meter.add(figures)
    meter.add(DraftFigures.of(_stats(drafted=30, plain=1990), RunConfig(max_new_tokens=2000)))
    assert meter.drafting_now is False  # twenty more steps, none drafted
    assert describe(figures, drafting_now=False).startswith("off now: plain steps are faster here · 1.5% of steps")
    assert describe(figures, drafting_now=True).startswith(
        "on in 1.5% of steps (plain steps where faster) · alpha 0.25"
    )
    every = DraftFigures.of(_stats(drafted=100, plain=0, accepted=2), RunConfig(max_new_tokens=300))
    assert describe(every) == "alpha 0.50 · 3.00 tokens/step · n-gram share 0%"


def test_a_checkpoint_without_the_count_names_each_figures_span() -> None:
    old = {k: v for k, v in _stats(drafted=30, plain=1970).to_dict().items() if k != "drafted_iterations"}
    assert Stats.from_dict(old).drafted_iterations is None
    auto = RunConfig(max_new_tokens=2000, draft=DraftConfig().drafting("auto")).to_dict()
    figures = DraftFigures.recorded(old, auto)
    assert describe(figures) == "alpha 0.25 over the steps that drafted · 1.01 tokens/step over all"
    never = {**old, "draft_slots": 0, "accepted": 0, "alpha": 0.0}
    assert describe(DraftFigures.recorded(never, auto)).startswith("off: plain steps are faster here")


def test_the_log_line_says_when_drafts_went_off() -> None:
    clock, stream = FakeClock(), io.StringIO()
    log = LogRenderer(stream, interval=10, clock=clock)
    for second in range(12):
        clock.now = second
        drafted = min(second, 3)  # the tuner drafted three steps, then ran plain steps only
        log.update(_with(DraftFigures("auto", 10 * second + 1, drafted, 0.25, 1.01, 0.0)))
    assert "drafts off now: plain steps are faster here, " in stream.getvalue()


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def screen(data: str) -> list[str]:
    """The rows a terminal shows after `data`: the text and the controls Rich's live display writes
    (carriage return, newline, cursor up, erase line)."""
    rows, row, col = [""], 0, 0
    for token in re.findall(r"\x1b\[[0-9;?]*[A-Za-z]|\r|\n|[^\x1b\r\n]+", data):
        if token == "\r":
            col = 0
        elif token == "\n":
            row, col = row + 1, 0
            rows += [""] * (row + 1 - len(rows))
        elif token == "\x1b[2K":
            rows[row] = ""
        elif token == "\x1b[1A":
            row = max(0, row - 1)
        elif not token.startswith("\x1b["):
            rows[row] = rows[row][:col].ljust(col) + token + rows[row][col + len(token) :]
            col += len(token)
    return rows


def test_a_warning_mid_run_leaves_no_text_line_twice_on_screen(monkeypatch: pytest.MonkeyPatch) -> None:
    """Once a streamed line showed twice: a write to stderr beside the live panel (a library's warning)
    moved the panel down a line, and the next redraw erased the wrong lines. It now goes above the panel."""
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)  # the panel's terminal is the process's stderr
    console = Console(file=terminal, force_terminal=True, width=80, color_system=None)
    live = LivePanel(console, takes_text=True, clock=FakeClock())
    live.live.auto_refresh = False  # redrawn by the test, not a thread
    live.start("tokenswift · run-007")
    live.update(_with(OFF))
    live.text("The keeper climbed the stairs and")
    live.live.refresh()
    print("a library's notice, mid-run", file=sys.stderr)  # as warnings.showwarning writes it
    live.live.refresh()
    live.text(" lit the lamp.\nThe sea was calm")
    live.live.refresh()
    live.close()
    rows = screen(terminal.getvalue())
    assert sum("The keeper climbed" in row for row in rows) == 1, rows
    assert "The keeper climbed the stairs and lit the lamp." in rows and "The sea was calm" in rows
    assert any("a library's notice, mid-run" in row for row in rows)  # shown, above the panel
    assert sum(row.startswith("╭─ tokenswift · run-007") for row in rows) == 1, rows  # one panel, no stale border
