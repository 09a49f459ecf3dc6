"""`tokenswift eval` of several runs: one table, a line per run with its recorded speed, one overall line."""

from __future__ import annotations

import json
from pathlib import Path

from test_quality import save_word_model
from typer.testing import CliRunner

from tokenswift_cli.cli.app import app
from tokenswift_cli.runs import checkpoint


def _run(root: Path, name: str, text: str, stats: dict[str, object] | None = None, written: int | None = None) -> None:
    """A run folder as eval reads it; `written`: the tokens its checkpoint says it wrote, all of `text`."""
    run = root / name
    run.mkdir(parents=True)
    (run / "settings.json").write_text("{}", encoding="utf-8")
    (run / "text.txt").write_text(text, encoding="utf-8")
    (run / "prefix.txt").write_text("the keeper lit the lamp .", encoding="utf-8")
    if stats is not None:  # the manifest of a checkpoint, as far as eval reads it
        state: dict[str, object] = {"stats": stats}
        if written is not None:
            state |= {"emitted": written, "text_bytes": len(text.encode())}
        body = {"schema": checkpoint.SCHEMA, "state": state, "files": []}
        (run / checkpoint.FOLDER).mkdir()
        manifest = {**body, "checksum": checkpoint._digest(body)}
        (run / checkpoint.FOLDER / checkpoint.MANIFEST).write_text(json.dumps(manifest), encoding="utf-8")


def test_eval_of_several_runs_is_one_table(tmp_path: Path) -> None:
    model, root = str(save_word_model(tmp_path / "m")), tmp_path / "runs"
    looped = "the sea was calm . " * 300  # 1,500 tokens: 3 stretches, looping
    varied = " ".join(["the keeper lit the lamp at dusk and the sea was calm ."] * 90)  # 1,170 tokens: 2
    stats = {"generated": 100, "iterations": 40, "seconds": {"prefill": 9.0, "draft": 2.0, "verify": 3.0}}
    _run(root, "run-001", looped, stats)
    _run(root, "run-002", varied)
    args = ["eval", "run-001", "2", "-m", model, "--runs-dir", str(root), "--no-perplexity"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert lines[0].startswith("| source | tokens | degenerate | NLL | distinct-1") and len(lines) == 8
    assert lines[2].startswith("| run-001 | 1500 | ") and lines[2].endswith("| 20.0 | 2.50 |")  # 100 tokens / 5 s
    assert lines[3].startswith("| 2 | 1170 | ") and lines[3].endswith("| - | - |")  # no checkpoint: no speed
    assert lines[4].startswith("| overall | 2670 | ")
    # Every `-` in the table is explained under it.
    assert lines[6:] == [
        "NLL: - = not measured (--no-perplexity).",
        "tokens/s, tokens/step: - = a text file, or a run without a checkpoint to read them from.",
    ]
    data = json.loads(CliRunner().invoke(app, [*args, "--json"]).output)
    per_run, total = [r["summary"] for r in data["runs"]], data["overall"]
    assert [r["stretches"] for r in per_run] == [3, 2] and total["stretches"] == 5
    assert total["degenerate"] == sum(r["degenerate"] for r in per_run)
    assert total["degenerate_share"] == total["degenerate"] / 5  # pooled over all stretches, not a mean of shares
    assert data["runs"][0]["tokens"] == 1500 and data["runs"][1]["context_tokens"] == 6
    weighted = (1500 * per_run[0]["distinct"][3] + 1170 * per_run[1]["distinct"][3]) / 2670
    assert abs(total["distinct"][3] - weighted) < 1e-12 and total["tokens_per_step"] == 2.5


def test_eval_of_one_run_keeps_its_report(tmp_path: Path) -> None:
    model, root = str(save_word_model(tmp_path / "m")), tmp_path / "runs"
    _run(root, "run-001", "the sea was calm . " * 30)
    result = CliRunner().invoke(app, ["eval", "1", "-m", model, "--runs-dir", str(root), "--no-perplexity"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == "1: 150 tokens after 6 tokens of context; NLL not measured (--no-perplexity)."
    assert "| tokens | NLL | ppl |" in result.output and "=" not in lines[0]  # no key=value line
    assert lines[-2:] == [
        "NLL, ppl: - = not measured (--no-perplexity).",
        "degenerate: the share of the 500-token stretches starting in the row that run words together, loop, list "
        "or chant; - = no whole 500-token stretch starts there.",
    ]


def test_eval_shows_the_tokens_a_run_wrote_and_the_judges_count_beside_them(tmp_path: Path) -> None:
    """A model may write a word in pieces that the judge's tokenizer joins: the run's count is shown, the
    judge's is named (the measures count those)."""
    model, root = str(save_word_model(tmp_path / "m")), tmp_path / "runs"
    stats = {"generated": 152, "iterations": 152, "seconds": {"verify": 2.0}}
    _run(root, "run-001", "the sea was calm . " * 30, stats, written=152)
    _run(root, "run-002", "the keeper lit the lamp . " * 20, stats, written=120)  # the same count: no note
    args = ["-m", model, "--runs-dir", str(root), "--no-perplexity"]
    one = CliRunner().invoke(app, ["eval", "1", *args])
    assert one.exit_code == 0, one.output
    assert one.output.splitlines()[:2] == [
        "1: 152 tokens written after 6 tokens of context; NLL not measured (--no-perplexity).",
        "The judge reads these 152 tokens as 150 (the model wrote some words in pieces that the judge's tokenizer "
        "joins); the rows count those.",
    ]
    several = CliRunner().invoke(app, ["eval", "1", "2", *args])
    lines = several.output.splitlines()
    assert lines[2].startswith("| 1 | 152 | ") and lines[3].startswith("| 2 | 120 | ")
    assert lines[4].startswith("| overall | 272 | ")
    assert "the judge reads 1 as 150 (" in several.output and " 2 as " not in several.output
    data = json.loads(CliRunner().invoke(app, ["eval", "1", "2", *args, "--json"]).output)
    assert [(r["summary"]["tokens"], r["summary"]["written_tokens"]) for r in data["runs"]] == [(150, 152), (120, 120)]
