"""`--prompt` (a request through the model's chat template) and `--stop` (the text ends at a string)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import PREFIX, build_tiny_folder, cli, one_thread, run_dir, with_chat_template
from transformers import AutoTokenizer

from tokenswift_cli.config import ConfigError
from tokenswift_cli.model.chat import ChatRequest, prompt_tokens
from tokenswift_cli.runs import runner
from tokenswift_cli.runs.stops import StopMatcher

TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }} {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant{% endif %}"
)
SAMPLED = ("--temperature", "1.0", "--min-p", "0.05", "--seed", "5")


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    with one_thread():
        yield


@pytest.fixture(scope="module")
def chat_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with a chat template (the tiny word-level vocabulary spells the roles as <unk>)."""
    return with_chat_template(build_tiny_folder(tmp_path_factory.mktemp("tiny-chat")), TEMPLATE)


@pytest.fixture(scope="module")
def plain_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_folder(tmp_path_factory.mktemp("tiny-plain"))


def written(*args: object) -> tuple[bytes, Path]:
    before = set(run_dir("x").parent.glob("run-*")) if run_dir("x").parent.exists() else set()
    result = cli("write", "-q", *args)
    assert result.exit_code == 0, result.output
    (created,) = set(run_dir("x").parent.glob("run-*")) - before
    return result.stdout_bytes, created


def test_a_request_is_the_chat_template_of_the_prompt(chat_folder: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(chat_folder)
    text = ChatRequest("lighthouse keeper", system="be brief").render(tokenizer)
    assert text == "system be brief\nuser lighthouse keeper\nassistant"
    assert prompt_tokens(tokenizer, text, templated=True) == tokenizer(text, add_special_tokens=False)["input_ids"]


def test_prompt_flags_reach_the_runner(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    calls: dict[str, Any] = {}
    monkeypatch.setattr(runner, "write", lambda **kwargs: calls.update(kwargs) or 0)
    assert cli("write", "--prompt", "Write a story", "--system", "Be kind", "-n", "10").exit_code == 0
    assert calls["request"] == ChatRequest("Write a story", system="Be kind") and calls["prefix"] is None
    request = tmp_path / "request.txt"
    request.write_text("A long report, please\n", encoding="utf-8")
    assert cli("write", "--prompt-file", request, "-n", "10", "--stop", "THE END", "--stop", "\n\n\n").exit_code == 0
    assert calls["request"] == ChatRequest("A long report, please\n")
    assert calls["config"].stop == ("THE END", "\n\n\n")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "say what to write"),
        (("--prompt", "x", "--prefix", "{prefix}"), "use one of --prefix and --prompt"),
        (("--prefix", "{prefix}", "--system", "s"), "--system goes with --prompt"),
        (("--prompt", "  "), "the prompt is empty"),
        (("--prompt-file", "missing.txt"), "prompt file not found"),
        (("--prompt", "x", "--stop", ""), "must not be empty"),
    ],
)
def test_bad_requests_are_one_line(args: tuple[str, ...], message: str, tmp_path: Path) -> None:
    prefix = tmp_path / "prefix.txt"
    prefix.write_text(PREFIX, encoding="utf-8")
    result = cli("write", "-n", "10", *(a.format(prefix=prefix) for a in args))
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("error: ") and message in lines[-1], result.stderr


def test_a_model_without_chat_template_says_so(plain_folder: Path) -> None:
    result = cli("write", "--prompt", "Write a story", "-n", "5", "-m", plain_folder, "-q")
    assert result.exit_code == 2 and "has no chat template: use --prefix" in result.stderr.strip().splitlines()[-1]


def test_a_request_is_recorded_and_resumes_exactly(chat_folder: Path) -> None:
    args = ("--prompt", "quel dri sun", "-m", chat_folder, *SAMPLED)
    first, run = written(*args, "-n", 30)
    prefix = json.loads((run / "settings.json").read_text())["prefix"]
    assert prefix["request"] == {"prompt": "quel dri sun", "system": None}
    assert (run / "prefix.txt").read_text() == "user quel dri sun\nassistant"
    more = cli("resume", run.name, "--tokens", 80, "-q")
    assert more.exit_code == 0, more.output
    assert first + more.stdout_bytes == written(*args, "-n", 80)[0]


def test_stop_ends_the_text_at_the_string_and_the_run_is_complete(chat_folder: Path, tmp_path: Path) -> None:
    prefix = tmp_path / "prefix.txt"
    prefix.write_text(PREFIX, encoding="utf-8")
    args = ("-p", prefix, "-m", chat_folder, *SAMPLED)
    full = written(*args, "-n", 120)[0].decode()
    stop = full.split()[len(full.split()) // 2]  # a word from the middle of the text
    text, run = written(*args, "-n", 120, "--stop", stop)
    assert text.decode() == full[: full.index(stop) + len(stop)]
    assert json.loads((run / "status.json").read_text())["state"] == "done"
    again = cli("resume", run.name, "--tokens", 200)
    assert again.exit_code == 2 and "ended at a --stop string" in again.stderr


def test_a_resumed_run_stops_at_a_string_begun_before_its_checkpoint(chat_folder: Path, tmp_path: Path) -> None:
    prefix = tmp_path / "prefix.txt"
    prefix.write_text(PREFIX, encoding="utf-8")
    args = ("-p", prefix, "-m", chat_folder, *SAMPLED)
    full = written(*args, "-n", 120)[0].decode()
    first, run = written(*args, "-n", 40)
    cut = len(first.decode())
    stop = full[cut - 3 : cut + 3]  # spans the end of the first run's text
    settings = json.loads((run / "settings.json").read_text())  # as if the run had been started with --stop
    settings["run_config"]["stop"] = [stop]
    (run / "settings.json").write_text(json.dumps(settings))
    more = cli("resume", run.name, "--tokens", 120, "-q")
    assert more.exit_code == 0, more.output
    assert (first + more.stdout_bytes).decode() == full[: cut + 3]  # not past the string that spans the two


def test_stop_matcher_finds_strings_across_chunks() -> None:
    matcher = StopMatcher(["THE END", "\n\n\n"])
    assert [matcher.cut(chunk) for chunk in ("hello TH", "E EN", "D and more")] == [
        ("hello TH", False), ("E EN", False), ("D", True),
    ]  # fmt: skip
    assert StopMatcher(["THE END"], tail="xx THE E").cut("ND more") == ("ND", True)
    assert StopMatcher([]).cut("abc") == ("abc", False)


def test_an_empty_prompt_is_refused() -> None:
    with pytest.raises(ConfigError):
        ChatRequest(" ")


def test_resume_continues_the_runs_own_out_file(chat_folder: Path, tmp_path: Path) -> None:
    prefix, out = tmp_path / "prefix.txt", tmp_path / "book.txt"
    prefix.write_text(PREFIX, encoding="utf-8")
    args = ("-p", prefix, "-m", chat_folder, *SAMPLED)
    first, run = written(*args, "-n", 40, "-o", out)
    (run / "text.txt").open("ab").write(b" lost")  # written after the checkpoint, then the run was killed
    out.open("ab").write(b" lost")
    more = cli("resume", run.name, "--tokens", 100, "-q")
    assert more.exit_code == 0, more.output
    assert out.read_bytes() == (run / "text.txt").read_bytes() == written(*args, "-n", 100)[0]


def test_the_resume_hint_names_the_command_as_it_was_run(monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil
    import sys

    from tokenswift_cli.cli.invocation import program_name

    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setattr(sys, "argv", [".venv/bin/tokenswift", "write"])
    assert program_name() == ".venv/bin/tokenswift"  # not on PATH: the path the user typed
    monkeypatch.setattr(sys, "argv", ["/src/tokenswift_cli/__main__.py", "write"])
    assert program_name() == f"{sys.executable} -m tokenswift_cli"
    monkeypatch.setattr(sys, "argv", ["/lib/pytest/__main__.py"])
    assert program_name() == "tokenswift"  # another program calling the library
    monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/tokenswift")
    monkeypatch.setattr(sys, "argv", ["/usr/bin/tokenswift", "write"])
    assert program_name() == "tokenswift"
