"""Help that agrees with itself and with the commands: one default per option, the one used; every
option's text shown whole; paragraphs that wrap at the terminal's width, not the source's."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
from cli_helpers import PREFIX
from typer.testing import CliRunner

from tokenswift_cli.cli import bench
from tokenswift_cli.cli.app import app
from tokenswift_cli.cli.options import TOKEN_SUFFIXES
from tokenswift_cli.parsing import parse_tokens
from tokenswift_cli.runs import runner

WIDE = "250"  # columns: every paragraph of the help fits on one line


def _commands() -> Iterator[tuple[list[str], Any]]:
    """Every command and group, with the words that call it (Typer bundles its own click: duck-typed)."""

    def walk(path: list[str], command: Any) -> Iterator[tuple[list[str], Any]]:
        yield path, command
        if hasattr(command, "commands"):
            for name, sub in command.commands.items():
                yield from walk([*path, name], sub)

    return walk([], typer.main.get_command(app))


COMMANDS = list(_commands())
IDS = [" ".join(path) or "tokenswift" for path, _ in COMMANDS]


def _help(*args: str, width: str = WIDE) -> str:
    result = CliRunner().invoke(app, [*args, "--help"], env={"COLUMNS": width})
    assert result.exit_code == 0, result.output
    return result.stdout


def _prose(text: str) -> str:
    """Help without Rich's boxes and line breaks: a phrase reads whole wherever a cell wraps it."""
    return " ".join(text.translate({ord(c): " " for c in "│╭╮╰╯─"}).split())


def _options(command: Any) -> list[Any]:
    return [p for p in command.params if p.param_type_name == "option" and p.help and not p.hidden]


@pytest.mark.parametrize(("path", "command"), COMMANDS, ids=IDS)
def test_an_option_states_one_default(path: list[str], command: Any) -> None:
    """An option whose help shows `[default: X]` does not also describe a default in its words."""
    for option in _options(command):
        shown = option.show_default is not False and option.default is not None and not option.is_flag
        if shown:
            assert not re.search(r"\bdefault:", option.help or "", re.IGNORECASE), (path, option.name, option.help)


@pytest.mark.parametrize(("path", "command"), COMMANDS, ids=IDS)
def test_every_options_help_is_shown_whole(path: list[str], command: Any) -> None:
    """Rich reads `[...]` as markup: a help text with such brackets would lose words on screen."""
    shown = _prose(_help(*path))
    for option in _options(command):
        assert _prose(option.help or "") in shown, (path, option.name)


@pytest.mark.parametrize(("path", "command"), COMMANDS, ids=IDS)
def test_paragraphs_wrap_at_the_terminals_width(path: list[str], command: Any) -> None:
    """A docstring's line breaks are the source's: in a wide terminal each paragraph is one line."""
    lines = [" ".join(line.split()) for line in _help(*path).splitlines()]
    for paragraph in (command.help or "").split("\n\n"):
        assert " ".join(paragraph.split()) in lines, (path, paragraph)


def test_write_help_reads_whole_in_a_narrow_terminal() -> None:
    """The sentence on resuming, which once broke off after "and `tokenswift resume`"."""
    shown = _prose(_help("write", width="80"))
    assert "Ctrl-C stops it after the current step, and `tokenswift resume` continues it with exactly the text" in shown


def _shown_default(help_text: str, option: str) -> str:
    """The `[default: X]` shown beside `option` (its row and the cell lines that follow)."""
    row = re.search(re.escape(option) + r"\s.*?\[default: ([^\]]+)\]", _prose(help_text))
    assert row is not None, option
    return row.group(1)


@pytest.fixture
def judged(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """What eval hands to the judge, with the judging itself left out."""
    calls: dict[str, Any] = {}

    def evaluate_text(text: str, spec: Any, **kwargs: Any) -> Any:
        calls["spec"] = spec
        raise typer.Exit(0)

    monkeypatch.setattr("tokenswift_cli.quality.report.evaluate_text", evaluate_text)
    return calls


def test_eval_uses_the_device_and_weights_its_help_shows(judged: dict[str, Any], tmp_path: Path) -> None:
    text = tmp_path / "text.txt"
    text.write_text(PREFIX, encoding="utf-8")
    assert CliRunner().invoke(app, ["eval", str(text)]).exit_code == 0
    shown = _help("eval")
    assert judged["spec"].device == _shown_default(shown, "--device") == "cpu"
    assert judged["spec"].weights == _shown_default(shown, "--weights") == "dense"
    assert "cuda where a GPU is present" not in shown  # the default is the CPU's, present GPU or not


@pytest.mark.parametrize("gpu", [False, True], ids=["cpu-only", "cuda-present"])
def test_write_uses_the_device_its_help_describes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, gpu: bool) -> None:
    import torch

    captured: dict[str, Any] = {}
    monkeypatch.setattr(runner, "write", lambda **kwargs: captured.update(kwargs) or 0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu)
    prefix = tmp_path / "prefix.txt"
    prefix.write_text(PREFIX, encoding="utf-8")
    assert CliRunner().invoke(app, ["write", "-p", str(prefix), "-n", "5"]).exit_code == 0
    assert "Default: cuda where a GPU is present, else cpu." in _prose(_help("write"))
    assert captured["model"].device == ("cuda" if gpu else "cpu")


def test_token_suffixes_are_documented_as_parsed() -> None:
    for command in (["write"], ["resume"]):
        assert f"({TOKEN_SUFFIXES})" in _prose(_help(*command)), command
    assert TOKEN_SUFFIXES == "k = 1,000, m = 1,000,000"
    assert [parse_tokens(t) for t in ("2k", "1.5k", "1m", "1.5m")] == [2_000, 1_500, 1_000_000, 1_500_000]
    assert "(k = 1,024)" in _prose(_help("bench")) and bench.parse_count("2k") == 2048


def test_bench_says_why_it_wrote_no_plot(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The help promises a PNG where matplotlib is installed; without it, the command says so."""
    assert "a PNG plot where matplotlib is installed" in _prose(_help("bench"))
    written = [tmp_path / "bench.json", tmp_path / "bench.csv"]
    monkeypatch.setattr("tokenswift_cli.bench.run.run_bench", lambda request, **_: ([], written))
    monkeypatch.setattr(bench.importlib.util, "find_spec", lambda name: None)
    result = CliRunner().invoke(app, ["bench", "-o", str(tmp_path)])
    assert result.exit_code == 0 and "no plot: matplotlib is not installed" in result.stderr
