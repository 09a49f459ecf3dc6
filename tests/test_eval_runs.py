"""`tokenswift eval` of several runs: one table, a line per run with its recorded speed, one overall line."""

from __future__ import annotations

import json
from pathlib import Path

from test_quality import save_word_model
from typer.testing import CliRunner

from tokenswift_cli.cli.app import app
from tokenswift_cli.runs import checkpoint


def _run(root: Path, name: str, text: str, stats: dict[str, object] | None = None) -> None:
    run = root / name
    run.mkdir(parents=True)
    (run / "settings.json").write_text("{}", encoding="utf-8")
    (run / "text.txt").write_text(text, encoding="utf-8")
    (run / "prefix.txt").write_text("the keeper lit the lamp .", encoding="utf-8")
    if stats is not None:  # the manifest of a checkpoint, as far as eval reads it
        body = {"schema": checkpoint.SCHEMA, "state": {"stats": stats}, "files": []}
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
    assert lines[0].startswith("| source | tokens | degenerate | NLL | distinct-1") and len(lines) == 5
    assert lines[2].startswith("| run-001 | 1500 | ") and lines[2].endswith("| 20.0 | 2.50 |")  # 100 tokens / 5 s
    assert lines[3].startswith("| 2 | 1170 | ") and lines[3].endswith("| - | - |")  # no checkpoint: no speed
    assert lines[4].startswith("| overall | 2670 | ")
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
    assert result.output.startswith("source=1 model=") and "| tokens | NLL | ppl |" in result.output
