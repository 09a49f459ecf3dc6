"""The live panel and the log lines, rendered without a terminal."""

from __future__ import annotations

import io

from rich.console import Console

from tokenswift_cli.cli.panel import (
    LivePanel,
    LogRenderer,
    RateMeter,
    format_bytes,
    format_duration,
    log_line,
    make_renderer,
    panel,
)
from tokenswift_cli.runs.drafts import DraftFigures
from tokenswift_cli.runs.progress import Progress, QuietRenderer

DRAFTING = DraftFigures("fixed", steps=394, drafted_steps=394, alpha=0.41, tokens_per_step=2.6, ngram_share=0.12)
SNAPSHOT = Progress(
    run_id="run-007", generated=1024, target=4096, decode_seconds=80.0, drafts=DRAFTING, context=1536,
    kv_bytes=70_500_000, last_checkpoint=1000,
)  # fmt: skip


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def render(renderable: object, width: int = 100) -> str:
    console = Console(file=io.StringIO(), width=width, color_system=None, force_terminal=False)
    console.print(renderable)
    return console.file.getvalue()  # type: ignore[attr-defined]


def test_panel_shows_progress_speed_drafts_context_and_checkpoint() -> None:
    text = render(panel(SNAPSHOT, 14.5, title="tokenswift · run-007", checkpoint_age=12))
    for expected in (
        "tokenswift · run-007", "1,024 / 4,096", "25%", "ETA 3m 32s", "14.5 tok/s now", "12.8 tok/s average",
        "alpha 0.41", "2.60 tokens/step", "n-gram share 12%", "1,536 tokens", "KV cache 70.5 MB",
        "checkpoint at 1,000 tokens (12s ago)",
    ):  # fmt: skip
        assert expected in text, expected
    assert "\x1b" not in text


def test_panel_before_any_checkpoint_and_at_the_end() -> None:
    fresh = Progress(**{**SNAPSHOT.__dict__, "last_checkpoint": None, "decode_seconds": 0.0})
    assert "no checkpoint yet" in render(panel(fresh, 0.0))
    assert "ETA ?" in render(panel(fresh, 0.0))
    done = Progress(**{**SNAPSHOT.__dict__, "generated": 4096})
    assert "100%" in render(panel(done, 10.0)) and "ETA 0s" in render(panel(done, 10.0))


def test_log_lines_come_every_interval_and_have_no_escape_codes() -> None:
    clock, stream = FakeClock(), io.StringIO()
    log = LogRenderer(stream, interval=10, clock=clock)
    log.start("run-007")
    for step in range(30):
        clock.now = step
        log.update(Progress(**{**SNAPSHOT.__dict__, "generated": 100 * step}))
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2  # at t = 10 and t = 20
    assert lines[0].startswith("run-007: 1000/4096 tokens (24%), 100.0 tok/s now")
    log.note("run-007: checkpoint")
    assert stream.getvalue().endswith("run-007: checkpoint\n")
    assert "\x1b" not in stream.getvalue()


def test_choice_of_renderer() -> None:
    assert isinstance(make_renderer(quiet=True, stderr=Terminal(), stdout=Terminal()), QuietRenderer)
    assert type(make_renderer(quiet=False, stderr=io.StringIO(), stdout=io.StringIO())) is LogRenderer
    live = make_renderer(quiet=False, stderr=Terminal(), stdout=io.StringIO())
    assert isinstance(live, LivePanel) and not live.takes_text  # stdout redirected: the text goes there
    shared = make_renderer(quiet=False, stderr=Terminal(), stdout=Terminal())
    assert isinstance(shared, LivePanel) and shared.takes_text  # one terminal: the panel prints the text


def test_live_panel_prints_whole_lines_above_itself() -> None:
    console = Console(file=io.StringIO(), width=80, color_system=None, force_terminal=False)
    live = LivePanel(console, takes_text=True, clock=FakeClock())
    live.text("first line\nsecond ")
    live.text("half\nthird [not markup]")
    assert console.file.getvalue() == "first line\nsecond half\n"  # type: ignore[attr-defined]
    live.update(SNAPSHOT)
    assert "third [not markup]" in render(live._renderable())
    live.live.start()
    live.close()
    assert "third [not markup]\n" in console.file.getvalue()  # type: ignore[attr-defined]


def test_quiet_renderer_says_nothing(capsys) -> None:  # type: ignore[no-untyped-def]
    quiet = QuietRenderer()
    quiet.start("x")
    quiet.update(SNAPSHOT)
    quiet.note("hello")
    quiet.close()
    assert capsys.readouterr() == ("", "")


def test_formatting_helpers() -> None:
    assert [format_duration(s) for s in (4.4, 65, 3725)] == ["4s", "1m 05s", "1h 02m"]
    assert [format_bytes(n) for n in (999, 70_500_000, 4_600_000_000)] == ["999 B", "70.5 MB", "4.6 GB"]
    clock = FakeClock()
    meter = RateMeter(window=5, clock=clock)
    for t in range(20):
        clock.now = t
        meter.add(10 * t if t < 10 else 100 + 50 * (t - 10))  # 10 tok/s, then 50 tok/s
    assert meter.rate == 50.0
    assert "eta" in log_line(SNAPSHOT, 0.0)


def test_a_long_paragraph_streams_above_the_panel_line_by_line() -> None:
    """One terminal for text and panel: a paragraph with no newline yet is not cut to its last screen line."""
    console = Console(file=io.StringIO(), width=40, color_system=None, force_terminal=False)
    live = LivePanel(console, takes_text=True, clock=FakeClock())
    words = [f"word{i}" for i in range(60)]
    for word in words:
        live.text(word + " ")
    shown = console.file.getvalue()  # type: ignore[attr-defined]
    assert all(len(line) <= 40 for line in shown.splitlines()) and len(live.pending) <= 40
    assert (shown.split() + live.pending.split()) == words  # every word, in order, once
    live.update(SNAPSHOT)
    live.live.start()
    live.note("run-007 done")  # the summary comes after the last of the text
    live.close()
    shown = console.file.getvalue().split()  # type: ignore[attr-defined]
    assert shown.index(words[-1]) + 1 == shown.index("run-007")
