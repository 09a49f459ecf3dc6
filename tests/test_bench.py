"""`tokenswift bench` on a tiny random model: every method runs, results are compared and written."""

from __future__ import annotations

import csv
import dataclasses
import importlib.util
import json

import pytest
import typer
from typer.testing import CliRunner

from tokenswift_cli.bench.harness import Bench, first_divergence
from tokenswift_cli.bench.models import BenchRequest, run_bench
from tokenswift_cli.bench.report import render_table
from tokenswift_cli.cli.bench import parse_count, register
from tokenswift_cli.quality.text import distinct_n

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


class _FakeLlama:
    """Stands in for llama_cpp.Llama: the wiring is tested here, the library by its own tests."""

    made: list[dict[str, object]] = []

    def __init__(self, **options: object) -> None:
        import sys

        params = sys.modules["llama_cpp.llama_cpp"].llama_model_default_params()  # as Llama() reads them
        _FakeLlama.made.append({**options, "use_extra_bufts": params.use_extra_bufts})
        self.seed = -1

    def set_seed(self, seed: int) -> None:
        self.seed = seed

    def generate(self, tokens: list[int], **options: object):  # type: ignore[no-untyped-def]
        assert options["top_k"] == 0 and options["top_p"] == 1.0 and options["min_p"] == 0.1
        assert options["temp"] == 1.0 and options["repeat_penalty"] == 1.2
        token = len(tokens) + self.seed
        while True:  # endless, like llama.cpp without a stop
            token += 1
            yield token % 100


def test_bench_times_llama_cpp_beside_the_engine(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import importlib.machinery
    import sys
    import types

    from tokenswift_cli.bench import models as bench_models

    fake = types.ModuleType("llama_cpp")
    fake.__spec__ = importlib.machinery.ModuleSpec("llama_cpp", None)
    fake.Llama = _FakeLlama  # type: ignore[attr-defined]
    api = types.ModuleType("llama_cpp.llama_cpp")
    api.llama_model_default_params = lambda: types.SimpleNamespace(use_extra_bufts=True)  # type: ignore[attr-defined]
    fake.llama_cpp = api  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "llama_cpp", fake)
    monkeypatch.setitem(sys.modules, "llama_cpp.llama_cpp", api)
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    monkeypatch.setattr(bench_models, "gguf_file", lambda model: gguf)
    request = BenchRequest(sampling="paper", seed=3, **TINY)  # type: ignore[arg-type]
    monkeypatch.setattr(BenchRequest, "chosen_methods", lambda self: ("plain", "llama_cpp"))
    settings = request.settings()
    llama = bench_models._llama(dataclasses.replace(request, quick=False), settings)
    assert _FakeLlama.made[-1]["model_path"] == str(gguf) and _FakeLlama.made[-1]["last_n_tokens_size"] == 1024
    assert _FakeLlama.made[-1]["n_ctx"] == 48 + 16 + 8  # the longest case
    assert _FakeLlama.made[-1]["use_extra_bufts"] is False  # its AMX kernels crash where AMX is not granted
    assert api.llama_model_default_params().use_extra_bufts is True  # restored
    target, heads, _, _ = bench_models.open_model(request)
    results = Bench(target, heads, settings, llama).run(list(range(2, 50)))
    by_method = {(r.case.context, r.method): r for r in results}
    fake_run = by_method[(48, "llama_cpp")]
    assert fake_run.tokens == 16 and fake_run.equal_to_plain is None and fake_run.speedup_plain
    assert "-" in render_table(results).columns[-1]._cells  # not marked as differing from plain


def test_llama_cpp_needs_a_gguf_model(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from tokenswift_cli.bench.llamacpp import gguf_file

    with pytest.raises(ValueError, match="needs a GGUF model"):
        gguf_file(str(tmp_path))
    request = BenchRequest(methods=("plain", "llama_cpp"), **TINY)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not the --quick tiny model"):
        run_bench(request, out_dir=tmp_path, name="x")


def test_auto_methods_add_llama_cpp_only_for_gguf_models(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from tokenswift_cli.bench import models as bench_models

    monkeypatch.setattr(bench_models, "llama_available", lambda: True)
    assert BenchRequest().chosen_methods()[-1] == "llama_cpp"
    assert BenchRequest(model="some/folder").chosen_methods()[-1] == "prompt_lookup"
    assert BenchRequest(quick=True).chosen_methods()[-1] == "prompt_lookup"
    monkeypatch.setattr(bench_models, "llama_available", lambda: False)
    assert BenchRequest().chosen_methods()[-1] == "prompt_lookup"


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="llama-cpp-python is not installed")
def test_llama_cpp_continues_the_default_model() -> None:
    from tokenswift_cli.bench.llamacpp import LlamaCpp, gguf_file
    from tokenswift_cli.config import SamplingConfig

    llama = LlamaCpp(gguf_file("default"), context=256, threads=1, sampling=SamplingConfig(temperature=1.0, min_p=0.1))
    prompt = [6403, 1980, 253, 655, 28, 281, 253, 33059, 411, 260, 3426, 28]  # "Once upon a time, in a lighthouse..."
    timed = llama.continue_text(prompt, 12)
    assert len(timed.tokens) == 12 and timed.timed_tokens == 11 and timed.seconds > 0
    assert all(0 <= t < 49152 for t in timed.tokens)  # (not the same text twice: llama.cpp recomputes the
    assert len(llama.continue_text(prompt, 12).tokens) == 12  # prompt's last token alone, with other roundings)
