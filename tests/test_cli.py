"""The `tokenswift` command: flags -> exact configs (patched runner), bad input -> one line, and the real
entry point end to end on a tiny model (pipes, interrupt + resume, kill -9 + resume)."""

from __future__ import annotations

import dataclasses
import json
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from cli_helpers import (
    PREFIX,
    build_tiny_folder,
    cli,
    command,
    drain,
    one_thread,
    run_dir,
    save_tiny_heads,
    start_blocked_writer,
    subprocess_env,
    wait_for,
)

from tokenswift_cli.config import AutoWindow, ContextWindow, DraftConfig, ModelSpec, RunConfig, SamplingConfig
from tokenswift_cli.model.heads import DraftHeads, save_heads
from tokenswift_cli.parsing import parse_tokens
from tokenswift_cli.runs import runner
from tokenswift_cli.runs.durable import RunLock
from tokenswift_cli.sampling import defaults

SAMPLED = ("--temperature", "1.0", "--min-p", "0.05", "--seed", "11")
LONG = 450  # tokens: their text (~5.5 KB) overflows the 4 KiB pipe of `start_blocked_writer`


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    with one_thread():
        yield


@pytest.fixture(scope="session")
def tiny_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_folder(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def tiny_heads(tiny_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_heads(tiny_folder, tmp_path_factory.mktemp("heads") / "tiny.safetensors")


@pytest.fixture
def prefix_file(tmp_path: Path) -> Path:
    path = tmp_path / "prefix.txt"
    path.write_text(PREFIX, encoding="utf-8")
    return path


def assert_one_line_error(result: Any, code: int = 2, contains: str = "") -> None:
    """Exit `code`, and one line `error: ...` (after log lines, if any), no traceback."""
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == code, result.stderr
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == 1 and errors[0] == lines[-1], result.stderr
    assert contains in errors[0]
    assert "Traceback" not in result.output and result.stdout == ""


# ---- flags -> configs, with the runner patched ----


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    calls: dict[str, Any] = {}

    def fake(name: str):  # type: ignore[no-untyped-def]
        def record(**kwargs: Any) -> int:
            calls[f"{name} renderer"] = kwargs.pop("renderer")  # the panel: a presentation, not a setting
            calls[name] = kwargs
            return 0

        return record

    monkeypatch.setattr(runner, "write", fake("write"))
    monkeypatch.setattr(runner, "resume", fake("resume"))
    return calls


def test_unset_sampling_flags_take_the_models_measured_defaults(captured: dict[str, Any], prefix_file: Path) -> None:
    result = cli("write", "--prefix", prefix_file, "--tokens", "10", "--penalty", "1.3", "--model", "some/model")
    assert result.exit_code == 0, result.output
    assert captured["write"]["config"].sampling == dataclasses.replace(defaults.PAPER, penalty=1.3)
    cli("write", "--prefix", prefix_file, "--tokens", "10", "-t", "0", "--min-p", "0")
    assert captured["write"]["config"].sampling == dataclasses.replace(defaults.EMBEDDED, temperature=0.0, min_p=0.0)
    cli("write", "--prefix", prefix_file, "--tokens", "10", "--dry", "0", "--scripts", "any")
    unfiltered = dataclasses.replace(defaults.EMBEDDED, dry_multiplier=None, scripts=())
    assert captured["write"]["config"].sampling == unfiltered


def test_write_defaults_are_the_library_defaults(captured: dict[str, Any], prefix_file: Path) -> None:
    """The library's defaults are the paper's fixed plan and dense weights (what old runs' settings mean); the
    tool tunes the plan (`--draft auto`) and picks the weights (`--weights auto`)."""
    result = cli("write", "--prefix", prefix_file, "--tokens", "2k")
    assert result.exit_code == 0, result.output
    assert captured["write"] == {
        "prefix": PREFIX,
        "request": None,
        "config": RunConfig(
            max_new_tokens=2000,
            sampling=defaults.EMBEDDED,
            draft=DraftConfig().drafting("auto"),
            window=AutoWindow(size=4092),
        ),
        "model": ModelSpec(weights="auto"),
        "heads": "default",
        "runs_dir": None,
        "output": runner.Output(),
    }


def test_write_maps_every_flag(captured: dict[str, Any], prefix_file: Path, tmp_path: Path) -> None:
    result = cli(
        "write", "-p", prefix_file, "-n", "1.5k", "-m", "some/model", "--heads", "none", "--dtype", "bfloat16",
        "--device", "cuda:1", "--rope-scaling", "yarn", "--rope-factor", "2", "-t", "0.7", "--top-p", "0.9",
        "--top-k", "40", "--min-p", "0.05", "--eta", "0.01", "--penalty", "1.2", "--penalty-window", "64",
        "--seed", "9", "--mode", "plain", "--tree", "1,2,2", "--draft", "verify", "--threads", "1",
        "--ngram-top-k", "0", "--partial-budget", "0", "-o", tmp_path / "book.txt", "--checkpoint-every", "100",
        "--runs-dir", tmp_path / "runs", "--stop-at-eos", "-q", "--context-window", "2k", "--sinks", "8",
        "--dry", "0.8", "--dry-base", "1.3", "--scripts", "latin,greek", "--weights", "int4", "--lookup", "24",
        "--xtc", "0.5", "--xtc-threshold", "0.15", "--spacing", "--max-word", "30",
        "--max-capitalised", "5", "--max-spaces", "6",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    sampling = SamplingConfig(
        temperature=0.7,
        top_k=40,
        top_p=0.9,
        min_p=0.05,
        eta=0.01,
        penalty=1.2,
        penalty_window=64,
        seed=9,
        dry_multiplier=0.8,
        dry_base=1.3,
        xtc_probability=0.5,
        xtc_threshold=0.15,
        scripts=("greek", "latin"),
        spacing=True,
        max_word=30,
        max_capitalised=5,
        max_spaces=6,
    )
    draft = DraftConfig(tree=(1, 2, 2), ngram_top_k=None, partial_budget=None, source="verify", lookup_length=24)
    assert captured["write"] == {
        "prefix": PREFIX,
        "request": None,
        "config": RunConfig(
            max_new_tokens=1500,
            mode="plain",
            stop_at_eos=True,
            sampling=sampling,
            draft=draft,
            window=ContextWindow(size=2000, sinks=8),
        ),  # fmt: skip
        "model": ModelSpec(
            name="some/model", dtype="bfloat16", device="cuda:1", rope_scaling="yarn", rope_factor=2.0, weights="int4"
        ),
        "heads": "none",
        "runs_dir": tmp_path / "runs",
        "output": runner.Output(out=tmp_path / "book.txt", checkpoint_every=100, quiet=True),
    }


def test_prefix_from_stdin(captured: dict[str, Any]) -> None:
    result = cli("write", "--prefix", "-", "--tokens", "10", input="Once upon a time")
    assert result.exit_code == 0, result.output
    assert captured["write"]["prefix"] == "Once upon a time"


def test_resume_maps_flags(captured: dict[str, Any], tmp_path: Path) -> None:
    result = cli("resume", "run-007", "--tokens", "8k", "--runs-dir", tmp_path, "-o", tmp_path / "b.txt", "-q")
    assert result.exit_code == 0, result.output
    assert captured["resume"] == {
        "run": "run-007",
        "tokens": 8000,
        "runs_dir": tmp_path,
        "output": runner.Output(out=tmp_path / "b.txt", quiet=True),
    }
    cli("resume", "42")
    assert captured["resume"]["tokens"] is None


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("20000", 20000),
        ("2K", 2000),
        ("2k", 2000),
        ("1.5k", 1500),
        ("100k", 100_000),
        ("1m", 1_000_000),
        ("20_000", 20000),
    ],
)
def test_token_counts(text: str, value: int) -> None:
    assert parse_tokens(text) == value


@pytest.mark.parametrize("text", ["", "abc", "0", "-5", "1.0001k", "2kk", "1e3", "k", "1.5"])
def test_bad_token_counts_are_one_line(captured: dict[str, Any], prefix_file: Path, text: str) -> None:
    assert_one_line_error(cli("write", "-p", prefix_file, "-n", text), contains="token count")
    assert "write" not in captured


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("-t", "-1"), "temperature"),
        (("--top-p", "1.5"), "top-p"),
        (("--min-p", "1"), "min-p"),
        (("--tree", "1,x"), "tree"),
        (("--mode", "fast"), "mode"),
        (("--penalty", "0"), "penalty"),
        (("--dry-base", "0.5"), "DRY base"),
        (("--device", "tpu"), "device"),
        (("--rope-scaling", "linear"), "rope scaling"),
        (("--draft", "fast"), "drafting"),
        (("--draft", "lookup", "--lookup", "0"), "lookup"),
        (("--threads", "0"), "threads"),
        (("--scripts", "latin,klingon"), "unknown script klingon"),
        (("--scripts", ","), "unknown script"),
        (("--temperature", "abc"), "temperature"),  # click's own check, also one line
    ],
)
def test_invalid_settings_are_one_line(
    captured: dict[str, Any], prefix_file: Path, args: tuple[str, ...], message: str
) -> None:
    assert_one_line_error(cli("write", "-p", prefix_file, "-n", "10", *args), contains=message)
    assert "write" not in captured


@pytest.mark.parametrize(
    ("content", "message"),
    [(None, "not found"), (b"", "empty"), (b"  \n", "empty"), (b"text\0more", "binary"), (b"\xff\xfe\xfa", "UTF-8"),
     ("folder", "folder")],
)  # fmt: skip
def test_bad_prefix_is_one_line(captured: dict[str, Any], tmp_path: Path, content: Any, message: str) -> None:
    path = tmp_path / "prefix.txt"
    if content == "folder":
        path.mkdir()
    elif content is not None:
        path.write_bytes(content)
    assert_one_line_error(cli("write", "-p", path, "-n", "10"), contains=message)
    assert "write" not in captured


def test_missing_option_is_one_line(captured: dict[str, Any]) -> None:
    assert_one_line_error(cli("write", "--tokens", "10"), contains="--prefix")


def test_version_and_examples_in_help() -> None:
    result = cli("--version")
    assert result.exit_code == 0 and result.stdout.startswith("tokenswift ")
    for args in (["--help"], ["write", "--help"], ["resume", "--help"], ["runs", "--help"], ["runs", "show", "--help"]):
        result = cli(*args)
        assert result.exit_code == 0 and "Example" in result.stdout, args


def test_help_and_runs_do_not_import_torch() -> None:
    code = (
        "import sys\nfrom typer.testing import CliRunner\nfrom tokenswift_cli.cli.app import app\n"
        "assert CliRunner().invoke(app, ['write', '--help']).exit_code == 0\n"
        "assert CliRunner().invoke(app, ['runs']).exit_code == 0\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env=subprocess_env())


COMMANDS = [
    [], ["write"], ["resume"], ["runs"], ["runs", "show"], ["runs", "rm"], ["bench"], ["eval"], ["train-heads"],
    ["heads"], ["heads", "import"], ["heads", "eval"], ["heads", "info"],
]  # fmt: skip


def _prose(help_text: str) -> str:
    """Help without Rich's boxes and line breaks, so that a phrase reads whole wherever the panel wraps it."""
    return " ".join(help_text.translate({ord(c): " " for c in "│╭╮╰╯─"}).split())


@pytest.mark.parametrize("args", COMMANDS, ids=lambda args: " ".join(args) or "tokenswift")
def test_every_command_has_an_example_and_plain_flags(args: list[str]) -> None:
    """On/off flags show no value placeholder: `--quiet true` is not how they are spelled."""
    result = cli(*args, "--help")
    assert result.exit_code == 0, result.output
    assert "Example: tokenswift " in _prose(result.stdout), args
    assert "<bool>" not in result.stdout and "--help -h Show this message" in _prose(result.stdout)


def test_a_flag_takes_no_value() -> None:
    assert_one_line_error(cli("write", "-p", "x.txt", "-n", "5", "--quiet", "true"), contains="(true)")


@pytest.mark.parametrize("args", [[], ["heads"]])
def test_a_group_alone_prints_its_help_and_no_error(args: list[str]) -> None:
    result = cli(*args)
    assert result.exit_code == 0 and "Usage:" in result.stdout
    assert "error" not in result.stderr


def test_a_run_times_its_own_costs_beside_the_engines(tiny_folder: Path, prefix_file: Path) -> None:
    """Checkpoints, the output stream and the panel are phases of the run's statistics (issue 41: a
    100K run's other costs are measured, not guessed)."""
    result = cli("write", "-p", prefix_file, "-n", 30, "-m", tiny_folder, "--checkpoint-every", 10, "-q")
    assert result.exit_code == 0, result.stderr
    seconds = json.loads((run_dir() / "checkpoint" / "manifest.json").read_text())["state"]["stats"]["seconds"]
    assert {"checkpoint", "output", "panel", "verify"} <= set(seconds)
    assert seconds["checkpoint"] > 0 and seconds["output"] > 0 and seconds["panel"] > 0


def test_write_help_shows_the_defaults_it_will_use() -> None:
    shown = _prose(cli("write", "--help").stdout)
    embedded, paper = defaults.EMBEDDED, defaults.PAPER
    assert "--penalty <float> Repetition penalty" in shown
    assert f"Default: {embedded.penalty} for the embedded model, {paper.penalty} for others." in shown
    assert f"Default: {embedded.min_p}." in shown
    assert f"Default: {embedded.temperature} for the embedded model, {paper.temperature} for others." in shown
    assert "Default: auto for the embedded model, any for others." in shown  # --scripts
    assert "nor a capital after a small letter. Default: on for the embedded model, off for others." in shown
    assert "0 = off. Default: 24 for the embedded model, off for others." in shown  # --max-word
    assert "[default: 1,3,3,3]" in shown and "the last 4,092 tokens" in shown  # tree, window


def test_write_hands_the_command_lines_renderer_to_the_runner(captured: dict[str, Any], prefix_file: Path) -> None:
    from tokenswift_cli.cli.panel import LogRenderer
    from tokenswift_cli.runs.progress import QuietRenderer

    cli("write", "--prefix", prefix_file, "--tokens", "10")
    assert type(captured["write renderer"]) is LogRenderer  # stderr is not a terminal here
    cli("write", "--prefix", prefix_file, "--tokens", "10", "--quiet")
    assert type(captured["write renderer"]) is QuietRenderer
    cli("resume", "run-001", "-q")
    assert type(captured["resume renderer"]) is QuietRenderer


def test_eval_tells_a_missing_file_from_an_unknown_run(tmp_path: Path) -> None:
    assert_one_line_error(cli("eval", "nosuch.txt"), contains="no such file: nosuch.txt")
    assert_one_line_error(cli("eval", str(tmp_path / "texts" / "book")), contains="no such file:")
    assert_one_line_error(cli("eval", "run-042", "--runs-dir", tmp_path), contains="no run named 'run-042'")


def test_unknown_run() -> None:
    assert_one_line_error(cli("resume", "run-999"), contains="no run named")
    assert_one_line_error(cli("runs", "show", "17"), contains="no run named")


def test_bad_model_path(prefix_file: Path, tmp_path: Path) -> None:
    assert_one_line_error(cli("write", "-p", prefix_file, "-n", "5", "-m", tmp_path / "nope"), contains="no such model")
    (tmp_path / "empty").mkdir()
    assert_one_line_error(cli("write", "-p", prefix_file, "-n", "5", "-m", tmp_path / "empty"), contains="config.json")


def test_heads_for_another_model(tiny_folder: Path, prefix_file: Path, tmp_path: Path) -> None:
    other = tmp_path / "other.safetensors"
    save_heads(DraftHeads(32, 3), other, {})
    result = cli("write", "-p", prefix_file, "-n", "5", "-m", tiny_folder, "--heads", other)
    assert_one_line_error(result, contains="hidden size")
    wrong = tmp_path / "wrong.safetensors"
    save_heads(DraftHeads(64, 3), wrong, {"base_model_fingerprint": "0" * 64})
    assert_one_line_error(
        cli("write", "-p", prefix_file, "-n", "5", "-m", tiny_folder, "--heads", wrong), contains="another model"
    )
    missing = cli("write", "-p", prefix_file, "-n", "5", "-m", tiny_folder, "--heads", tmp_path / "missing.safetensors")
    assert_one_line_error(missing, contains="not found")


def test_unwritable_runs_folder_or_out_file(tiny_folder: Path, prefix_file: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    result = cli("write", "-p", prefix_file, "-n", "5", "-m", tiny_folder, "--runs-dir", blocker / "runs")
    assert_one_line_error(result, contains="not writable")
    result = cli("write", "-p", prefix_file, "-n", "5", "-m", tiny_folder, "-o", tmp_path / "no" / "book.txt")
    assert_one_line_error(result, contains="folder does not exist")
    assert not run_dir().exists()


# ---- end to end on the tiny model ----


_REFERENCES: dict[tuple[object, ...], bytes] = {}


def reference(folder: Path, prefix: Path, tokens: int, *extra: object) -> bytes:
    """The text of one uninterrupted run with these settings (computed once per session)."""
    key = (folder, PREFIX, tokens, *extra)
    if key not in _REFERENCES:
        _REFERENCES[key] = write_in_process(folder, prefix, tokens, *extra)[0]
    return _REFERENCES[key]


def write_in_process(folder: Path, prefix: Path, tokens: int, *extra: object) -> tuple[bytes, Path]:
    """One uninterrupted run; returns its stdout and its run folder."""
    before = set((run_dir("x").parent).glob("run-*")) if run_dir("x").parent.exists() else set()
    result = cli("write", "-p", prefix, "-n", tokens, "-m", folder, "-q", *extra)
    assert result.exit_code == 0, result.output
    (created,) = set(run_dir("x").parent.glob("run-*")) - before
    return result.stdout_bytes, created


def test_piped_stdout_equals_the_run_text(tiny_folder: Path, prefix_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "copy.txt"
    done = subprocess.run(
        command("write", "-p", prefix_file, "-n", 120, "-m", tiny_folder, "-o", out, *SAMPLED),
        capture_output=True, env=subprocess_env(), check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    text = (run_dir() / "text.txt").read_bytes()
    assert done.stdout == text == out.read_bytes()
    assert len(text) > 200 and text.decode("utf-8")  # valid UTF-8
    assert b"\x1b" not in done.stderr  # not a terminal: plain log lines, no escape codes
    assert b"run-001 done: 120 tokens" in done.stderr
    status = json.loads((run_dir() / "status.json").read_text())
    assert status["state"] == "done"


def test_quiet_prints_nothing_on_stderr(tiny_folder: Path, prefix_file: Path) -> None:
    result = cli("write", "-p", prefix_file, "-n", 30, "-m", tiny_folder, "--quiet")
    assert result.exit_code == 0 and result.stderr == ""
    assert result.stdout_bytes == (run_dir() / "text.txt").read_bytes()


@pytest.mark.parametrize(
    ("sampled", "sig"), [(False, signal.SIGINT), (True, signal.SIGTERM)], ids=["greedy-sigint", "sampled-sigterm"]
)
def test_interrupt_then_resume_equals_uninterrupted(
    tiny_folder: Path, tiny_heads: Path, prefix_file: Path, sampled: bool, sig: signal.Signals
) -> None:
    settings = ("--heads", tiny_heads, *SAMPLED) if sampled else ()
    args = ("-p", prefix_file, "-n", LONG, "-m", tiny_folder, "--checkpoint-every", 40, *settings)
    process, read = start_blocked_writer("write", *args)
    wait_for(run_dir() / "checkpoint" / "kv-000002.safetensors", process)  # generation is under way
    process.send_signal(sig)
    first = drain(read)
    stderr = process.stderr.read().decode() if process.stderr else ""
    assert process.wait(600) == 128 + sig, stderr
    assert f"resume with: {sys.executable} -m tokenswift_cli resume run-001" in stderr  # the command as run
    assert json.loads((run_dir() / "status.json").read_text())["state"] == "interrupted"
    assert first == (run_dir() / "text.txt").read_bytes()  # everything written is in the checkpoint
    manifest = json.loads((run_dir() / "checkpoint" / "manifest.json").read_text())
    assert 40 <= manifest["state"]["emitted"] < LONG

    listing = cli("runs")
    assert "run-001" in listing.stdout and "interrupted" in listing.stdout
    resumed = cli("resume", "run-001", "-q")
    assert resumed.exit_code == 0, resumed.output
    expected = reference(tiny_folder, prefix_file, LONG, *settings)
    assert first + resumed.stdout_bytes == expected
    assert (run_dir() / "text.txt").read_bytes() == expected


def test_kill_9_then_resume(tiny_folder: Path, tiny_heads: Path, prefix_file: Path) -> None:
    settings = ("--heads", tiny_heads, *SAMPLED)
    args = ("-p", prefix_file, "-n", LONG, "-m", tiny_folder, "--checkpoint-every", 30, *settings)
    process, read = start_blocked_writer("write", *args)
    wait_for(run_dir() / "checkpoint" / "kv-000003.safetensors", process)
    process.kill()
    process.wait(600)
    drain(read)
    assert cli("runs", "--json").stdout.count('"interrupted"') == 1  # the lock died with the process
    kept = json.loads((run_dir() / "checkpoint" / "manifest.json").read_text())["state"]["text_bytes"]

    resumed = cli("resume", "1")
    assert resumed.exit_code == 0, resumed.output
    expected = reference(tiny_folder, prefix_file, LONG, *settings)
    assert (run_dir() / "text.txt").read_bytes() == expected
    assert resumed.stdout_bytes == expected[kept:]
    report = json.loads(cli("runs", "show", "run-001", "--json").stdout)
    assert report["state"] == "done" and report["statistics"]["generated_tokens"] == LONG
    assert report["settings"]["heads"]["path"] == str(tiny_heads)


@pytest.mark.parametrize("sampling", [(), SAMPLED], ids=["greedy", "sampled"])
def test_raising_the_target_equals_one_longer_run(
    tiny_folder: Path, prefix_file: Path, sampling: tuple[str, ...]
) -> None:
    first, short = write_in_process(tiny_folder, prefix_file, 67, *sampling)
    refused = cli("resume", short.name)
    assert_one_line_error(refused, contains="complete")
    more = cli("resume", short.name, "--tokens", 150, "-q")
    assert more.exit_code == 0, more.output
    expected = reference(tiny_folder, prefix_file, 150, *sampling)
    assert first + more.stdout_bytes == expected == (short / "text.txt").read_bytes()
    assert json.loads((short / "settings.json").read_text())["run_config"]["max_new_tokens"] == 150


def test_resume_refuses_a_locked_run(tiny_folder: Path, prefix_file: Path) -> None:
    _, folder = write_in_process(tiny_folder, prefix_file, 20)
    cli("resume", folder.name, "--tokens", 40)  # works while nobody holds the lock
    with RunLock(folder):
        assert_one_line_error(cli("resume", folder.name, "--tokens", 60), contains="another process")
        assert "running" in cli("runs").stdout
        assert_one_line_error(cli("runs", "rm", folder.name), contains="running")


def snapshot(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != "lock"
    }


def test_resume_refuses_another_model_without_touching_the_run(
    tiny_folder: Path, prefix_file: Path, tmp_path: Path
) -> None:
    model = tmp_path / "model"
    shutil.copytree(tiny_folder, model)
    _, folder = write_in_process(model, prefix_file, 20)
    build_tiny_folder(model, seed=1)  # same path, other weights
    before = snapshot(folder)
    assert_one_line_error(cli("resume", folder.name, "--tokens", 40), contains="another model")
    assert snapshot(folder) == before


def test_a_run_records_its_device_and_a_gpu_run_resumes_only_on_a_gpu(tiny_folder: Path, prefix_file: Path) -> None:
    _, folder = write_in_process(tiny_folder, prefix_file, 20)  # no --device: cuda where present, else cpu
    settings = json.loads((folder / "settings.json").read_text())
    here = "cuda" if torch.cuda.is_available() else "cpu"
    assert settings["model"]["spec"]["device"] == here and settings["device"]["type"] == here
    if here == "cuda":
        return
    settings["device"] = {"type": "cuda", "name": "NVIDIA H200"}  # as if written on a GPU machine
    (folder / "settings.json").write_text(json.dumps(settings))
    before = snapshot(folder)
    assert_one_line_error(cli("resume", folder.name, "--tokens", 40), contains="written on a GPU (NVIDIA H200)")
    assert snapshot(folder) == before
    settings["device"] = {"type": "cpu", "name": "another-cpu"}
    (folder / "settings.json").write_text(json.dumps(settings))
    resumed = cli("resume", folder.name, "--tokens", 40)
    assert resumed.exit_code == 0 and "was written on another-cpu (cpu), resumes on" in resumed.stderr


def test_a_run_records_its_4bit_arithmetic_and_says_when_it_resumes_under_another(
    tiny_folder: Path, prefix_file: Path
) -> None:
    from tokenswift_cli.backends.cpu import int4

    _, folder = write_in_process(tiny_folder, prefix_file, 20, "--weights", "int4")
    settings = json.loads((folder / "settings.json").read_text())
    assert settings["model"]["arithmetic"] == int4.ARITHMETIC
    del settings["model"]["arithmetic"]  # as runs written until 2026-11-27 are
    (folder / "settings.json").write_text(json.dumps(settings))
    resumed = cli("resume", folder.name, "--tokens", 40)
    assert resumed.exit_code == 0
    assert f"computed from {int4.EARLIER}; resumes with {int4.ARITHMETIC}" in resumed.stderr
    settings["model"]["arithmetic"] = int4.ARITHMETIC
    (folder / "settings.json").write_text(json.dumps(settings))
    again = cli("resume", folder.name, "--tokens", 60)  # the arithmetic it records: nothing to say
    assert again.exit_code == 0 and "computed from" not in again.stderr


def test_resume_refuses_a_corrupted_checkpoint(tiny_folder: Path, prefix_file: Path) -> None:
    _, folder = write_in_process(tiny_folder, prefix_file, 60, "--checkpoint-every", 20)
    segment = sorted((folder / "checkpoint").glob("kv-*.safetensors"))[1]
    data = bytearray(segment.read_bytes())
    data[-5] ^= 0xFF
    segment.write_bytes(bytes(data))
    before = snapshot(folder)
    assert_one_line_error(cli("resume", folder.name, "--tokens", 80), contains="corrupted")
    assert snapshot(folder) == before
    (folder / "checkpoint" / "manifest.json").write_text("{not json")
    assert_one_line_error(cli("resume", folder.name, "--tokens", 80), contains="manifest")


def test_runs_list_show_and_remove(tiny_folder: Path, prefix_file: Path) -> None:
    assert "no runs" in cli("runs").stdout
    _, folder = write_in_process(tiny_folder, prefix_file, 25)
    listing = cli("runs")
    assert listing.exit_code == 0
    assert "run-001" in listing.stdout and "done" in listing.stdout and "25/25" in listing.stdout
    shown = cli("runs", "show", "run-001")
    assert "tiny-llama" in shown.stdout
    assert "25/25 tokens" in shown.stdout
    report = json.loads(cli("runs", "show", "1", "--json").stdout)
    # A local model gets the paper's sampling; <eos> is suppressed.
    sampling = dataclasses.replace(defaults.PAPER, suppress_token_ids=(1,))
    # A dense model's KV cache as it computes ("auto" resolved and recorded).
    expected = RunConfig(max_new_tokens=25, sampling=sampling, draft=DraftConfig().drafting("auto"), kv_cache="model")
    assert report["settings"]["run_config"] == json.loads(json.dumps(expected.to_dict()))
    assert set(report["statistics"]) >= {
        "generated_tokens",
        "seconds",
        "tokens_per_second",
        "alpha",
        "mean_accepted_length",
    }
    removed = cli("runs", "rm", "run-001", "--yes")
    assert removed.exit_code == 0 and not folder.exists()
    assert_one_line_error(cli("runs", "rm", "run-001", "--yes"), contains="no run named")


def test_settings_record_the_resolved_model_and_resume_loads_it(tiny_folder: Path, prefix_file: Path) -> None:
    _, auto = write_in_process(tiny_folder, prefix_file, 10)
    settings = json.loads((auto / "settings.json").read_text())
    assert settings["model"]["spec"]["rope_scaling"] == "none"  # "auto": the run fits the trained length
    assert settings["run_config"]["sampling"]["suppress_token_ids"] == [1]  # <eos>, without --stop-at-eos
    yarn = ("--rope-scaling", "yarn", "--rope-factor", "2", "-t", "0")
    first, scaled = write_in_process(tiny_folder, prefix_file, 30, *yarn)
    spec = json.loads((scaled / "settings.json").read_text())["model"]["spec"]
    assert (spec["rope_scaling"], spec["rope_factor"]) == ("yarn", 2.0)
    more = cli("resume", scaled.name, "--tokens", 60, "-q")
    assert more.exit_code == 0, more.output
    assert first + more.stdout_bytes == reference(tiny_folder, prefix_file, 60, *yarn)
    greedy = reference(tiny_folder, prefix_file, 60, "-t", "0")
    assert first + more.stdout_bytes != greedy  # the scaling did change the model


def test_a_windowed_run_records_its_window_and_resumes_to_one_longer_run(tiny_folder: Path, prefix_file: Path) -> None:
    window = ("--context-window", "32", "--sinks", "2", *SAMPLED)
    first, run = write_in_process(tiny_folder, prefix_file, 67, *window)
    assert json.loads((run / "settings.json").read_text())["run_config"]["window"] == {"size": 32, "sinks": 2}
    more = cli("resume", run.name, "--tokens", 150, "-q")
    assert more.exit_code == 0, more.output
    assert first + more.stdout_bytes == reference(tiny_folder, prefix_file, 150, *window)
    assert first + more.stdout_bytes != reference(tiny_folder, prefix_file, 150, *SAMPLED)


def test_a_bad_context_window_is_one_line(captured: dict[str, Any], prefix_file: Path) -> None:
    result = cli("write", "--prefix", prefix_file, "--tokens", "10", "--context-window", "8")
    assert_one_line_error(result, contains="context window must hold at least 16 tokens")
    result = cli("write", "--prefix", prefix_file, "--tokens", "10", "--context-window", "wide")
    assert_one_line_error(result, contains="bad token count")


def test_kv_cache_flag_reaches_the_config_and_a_bad_one_is_one_line(
    captured: dict[str, Any], prefix_file: Path
) -> None:
    assert cli("write", "--prefix", prefix_file, "--tokens", "10", "--kv-cache", "float16").exit_code == 0
    assert captured["write"]["config"].kv_cache == "float16"
    assert cli("write", "--prefix", prefix_file, "--tokens", "10", "--kv-cache", "int8").exit_code == 0
    assert captured["write"]["config"].kv_cache == "int8"
    result = cli("write", "--prefix", prefix_file, "--tokens", "10", "--kv-cache", "int4")
    assert_one_line_error(result, contains="unknown KV cache 'int4': use auto, model, float16, int8")


def test_float16_kv_cache_is_recorded_and_resumes_exactly(tiny_folder: Path, prefix_file: Path) -> None:
    narrow = ("--kv-cache", "float16", *SAMPLED)
    first, run = write_in_process(tiny_folder, prefix_file, 40, *narrow)
    assert json.loads((run / "settings.json").read_text())["run_config"]["kv_cache"] == "float16"
    more = cli("resume", run.name, "--tokens", 90, "-q")
    assert more.exit_code == 0, more.output
    assert first + more.stdout_bytes == reference(tiny_folder, prefix_file, 90, *narrow)


def test_scripts_auto_keeps_the_prefix_scripts_records_them_and_resumes_exactly(
    tiny_folder: Path, prefix_file: Path
) -> None:
    scripts = ("--scripts", "auto", *SAMPLED)
    first, run = write_in_process(tiny_folder, prefix_file, 60, *scripts)
    assert json.loads((run / "settings.json").read_text())["run_config"]["sampling"]["scripts"] == ["latin"]
    more = cli("resume", run.name, "--tokens", 200, "-q")
    assert more.exit_code == 0, more.output
    text = first + more.stdout_bytes
    assert text == reference(tiny_folder, prefix_file, 200, *scripts)
    free = reference(tiny_folder, prefix_file, 200, *SAMPLED)
    foreign = ("日本語".encode(), "🙂".encode())
    assert any(word in free for word in foreign) and not any(word in text for word in foreign)
    assert "café".encode() in text + free  # Latin letters stay allowed


def test_the_spacing_rule_is_recorded_and_a_run_resumes_exactly(tiny_folder: Path, prefix_file: Path) -> None:
    spacing = ("--spacing", *SAMPLED)
    first, run = write_in_process(tiny_folder, prefix_file, 60, *spacing)
    assert json.loads((run / "settings.json").read_text())["run_config"]["sampling"]["spacing"] is True
    more = cli("resume", run.name, "--tokens", 150, "-q")
    assert more.exit_code == 0, more.output
    assert first + more.stdout_bytes == reference(tiny_folder, prefix_file, 150, *spacing)


def test_the_word_cap_is_recorded_and_a_run_resumes_exactly(tiny_folder: Path, prefix_file: Path) -> None:
    capped = ("--max-word", "3", *SAMPLED)
    first, run = write_in_process(tiny_folder, prefix_file, 60, *capped)
    assert json.loads((run / "settings.json").read_text())["run_config"]["sampling"]["max_word"] == 3
    more = cli("resume", run.name, "--tokens", 150, "-q")
    assert more.exit_code == 0, more.output
    text = first + more.stdout_bytes
    assert text == reference(tiny_folder, prefix_file, 150, *capped)
    assert text != reference(tiny_folder, prefix_file, 150, *SAMPLED)  # the cap had work to do
    _, off = write_in_process(tiny_folder, prefix_file, 5, "--max-word", "0", *SAMPLED)
    assert json.loads((off / "settings.json").read_text())["run_config"]["sampling"]["max_word"] is None


@pytest.mark.parametrize("flag", ["--max-capitalised", "--max-spaces"])
def test_a_cap_is_recorded_and_a_run_resumes_exactly(tiny_folder: Path, prefix_file: Path, flag: str) -> None:
    capped, name = (flag, "1", *SAMPLED), flag[2:].replace("-", "_")
    first, run = write_in_process(tiny_folder, prefix_file, 60, *capped)
    assert json.loads((run / "settings.json").read_text())["run_config"]["sampling"][name] == 1
    more = cli("resume", run.name, "--tokens", 150, "-q")
    assert more.exit_code == 0, more.output
    # The rules' effects are tested in test_capitals and test_whitespace (the tiny model writes neither often).
    assert first + more.stdout_bytes == reference(tiny_folder, prefix_file, 150, *capped)
    _, off = write_in_process(tiny_folder, prefix_file, 5, flag, "0", *SAMPLED)
    assert json.loads((off / "settings.json").read_text())["run_config"]["sampling"][name] is None


def test_int4_weights_are_recorded_and_a_run_resumes_exactly(tiny_folder: Path, prefix_file: Path) -> None:
    weights = ("--weights", "int4", *SAMPLED)
    first, run = write_in_process(tiny_folder, prefix_file, 50, *weights)
    assert json.loads((run / "settings.json").read_text())["model"]["spec"]["weights"] == "int4"
    more = cli("resume", run.name, "--tokens", 120, "-q")
    assert more.exit_code == 0, more.output
    assert first + more.stdout_bytes == reference(tiny_folder, prefix_file, 120, *weights)
    assert first + more.stdout_bytes != reference(tiny_folder, prefix_file, 120, *SAMPLED)
    _, auto = write_in_process(tiny_folder, prefix_file, 5, *SAMPLED)  # random weights: auto keeps them dense
    assert json.loads((auto / "settings.json").read_text())["model"]["spec"]["weights"] == "dense"
