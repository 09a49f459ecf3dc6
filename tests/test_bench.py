"""`tokenswift bench` on a tiny random model: every method runs, results are compared and written."""

from __future__ import annotations

import csv
import json

import pytest
import typer
from typer.testing import CliRunner

from tokenswift_cli.bench import distinct_n, first_divergence
from tokenswift_cli.bench_models import BenchRequest, run_bench
from tokenswift_cli.cli_bench import parse_count, register

TINY = {
    "quick": True, "dtype": "float32", "lengths": (24,), "length_context": 16, "contexts": (48,), "context_tokens": 16,
}  # fmt: skip


def test_counts_and_measures() -> None:
    assert [parse_count(t) for t in ("512", "2k", "1.5k")] == [512, 2048, 1536]
    assert distinct_n([1, 2, 1, 2], 1) == 0.5
    assert distinct_n([1, 2, 1, 2], 2) == pytest.approx(2 / 3)
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1


@pytest.mark.parametrize("sampling", ["greedy", "paper"])
def test_quick_bench_compares_every_method(tmp_path, sampling: str) -> None:  # type: ignore[no-untyped-def]
    results, paths = run_bench(BenchRequest(sampling=sampling, **TINY), out_dir=tmp_path, name="b")  # type: ignore[arg-type]
    assert [(r.case.axis, r.method) for r in results[:4]] == [
        ("length", m) for m in ("plain", "tokenswift", "generate", "prompt_lookup")
    ]
    assert len(results) == 8
    by_method = {(r.case.context, r.method): r for r in results}
    for context in (16, 48):
        fast = by_method[(context, "tokenswift")]
        assert fast.equal_to_plain, fast.first_divergence  # lossless in the bench too
        assert fast.alpha is not None and fast.mean_accepted is not None and fast.mean_accepted >= 1
        assert by_method[(context, "plain")].speedup_plain == pytest.approx(1.0)
        if sampling == "greedy":  # transformers' own greedy decoding writes the same text
            assert by_method[(context, "generate")].equal_to_plain
    assert all(r.tokens == r.case.new_tokens and r.peak_rss_mb > 0 for r in results)
    document = json.loads((tmp_path / "b.json").read_text())
    assert len(document["results"]) == 8 and document["machine"]["cpus"]
    rows = list(csv.DictReader((tmp_path / "b.csv").open()))
    assert rows[1]["method"] == "tokenswift" and float(rows[1]["speedup_plain"]) > 0
    assert {p.suffix for p in paths} >= {".json", ".csv"}


def test_cli_bench_runs_quick(tmp_path) -> None:  # type: ignore[no-untyped-def]
    app = typer.Typer()
    register(app)
    app.command("noop")(lambda: None)  # two commands, so that `bench` is addressed by name
    args = ["bench", "--quick", "--dtype", "float32", "--lengths", "16", "--length-context", "8", "--contexts", "",
            "--methods", "plain,tokenswift", "--sampling", "greedy", "-o", str(tmp_path), "--name", "q"]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader((tmp_path / "q.csv").open()))
    assert [r["method"] for r in rows] == ["plain", "tokenswift"]


def test_cli_bench_refuses_unknown_method(tmp_path) -> None:  # type: ignore[no-untyped-def]
    app = typer.Typer()
    register(app)
    app.command("noop")(lambda: None)
    result = CliRunner().invoke(app, ["bench", "--quick", "--methods", "plain,warp", "-o", str(tmp_path)])
    assert result.exit_code == 2


def test_bench_runs_the_engine_under_a_context_window(tmp_path) -> None:  # type: ignore[no-untyped-def]
    request = BenchRequest(sampling="paper", methods=("plain", "tokenswift"), context_window="16", **TINY)  # type: ignore[arg-type]
    results, _ = run_bench(request, out_dir=tmp_path, name="w")
    assert all(r.equal_to_plain for r in results if r.method == "tokenswift")
    document = json.loads((tmp_path / "w.json").read_text())
    assert document["settings"]["rope"]["window"] == {"size": 16, "sinks": 4}
