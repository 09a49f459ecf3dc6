"""`tokenswift bench` on a tiny random model: every method runs, results are compared and written."""

from __future__ import annotations

import csv
import dataclasses
import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
import torch
import typer
from cli_helpers import PREFIX, build_tiny_folder, cli, one_thread, run_dir
from rich.console import Console
from typer.testing import CliRunner

from tokenswift_cli.bench.compare import Equality, first_divergence, generate_gaps
from tokenswift_cli.bench.harness import Bench, Case, Result, _compare, _Run
from tokenswift_cli.bench.models import BenchRequest, open_model, quick_model
from tokenswift_cli.bench.report import render_table, write_results
from tokenswift_cli.bench.run import run_bench
from tokenswift_cli.cli.bench import parse_count, register
from tokenswift_cli.config import ContextWindow, RunConfig, SamplingConfig
from tokenswift_cli.model.target import Target
from tokenswift_cli.quality.text import distinct_n
from tokenswift_cli.runs import runner
from tokenswift_cli.sampling.defaults import EMBEDDED, PAPER

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
    assert [case["window"] for case in document["settings"]["cases"]] == [{"size": 16, "sinks": 4}] * 2


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
    from tokenswift_cli.bench import run as bench_run

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
    monkeypatch.setattr(bench_run, "gguf_file", lambda model: gguf)
    request = BenchRequest(sampling="paper", seed=3, **TINY)  # type: ignore[arg-type]
    monkeypatch.setattr(BenchRequest, "chosen_methods", lambda self: ("plain", "llama_cpp"))
    settings = request.settings(request.run_config())
    llama = bench_run._llama(dataclasses.replace(request, quick=False), settings)
    assert _FakeLlama.made[-1]["model_path"] == str(gguf) and _FakeLlama.made[-1]["last_n_tokens_size"] == 1024
    assert _FakeLlama.made[-1]["n_ctx"] == 48 + 16 + 8  # the longest case
    assert _FakeLlama.made[-1]["use_extra_bufts"] is False  # its AMX kernels crash where AMX is not granted
    assert api.llama_model_default_params().use_extra_bufts is True  # restored
    opened = bench_models.open_model(request)
    results = Bench(opened.target, opened.heads, settings, llama).run(list(range(2, 50)))
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


# ---- tokens and rates, same lengths, write's defaults, equality with generate() ----


def _table_text(results: list[Result]) -> str:
    console = Console(width=400, record=True, file=open("/dev/null", "w"))  # noqa: SIM115 - closed with the console
    console.print(render_table(results))
    return console.export_text()


def test_speedups_are_ratios_of_tokens_per_second_and_short_runs_are_flagged(tmp_path: Path) -> None:
    case = Case(context=8, new_tokens=10)
    runs = {
        "plain": [_Run(list(range(10)), 2.0, 1.0), _Run(list(range(10)), 4.0, 1.0)],  # 5 or 2.5 tok/s
        "tokenswift": [_Run(list(range(10)), 1.0, 1.0), _Run(list(range(10)), 0.5, 1.0)],  # 10 or 20 tok/s
        "generate": [_Run(list(range(4)), 0.2, 1.0), _Run(list(range(4)), 0.2, 1.0)],  # stopped at 4 of 10
    }
    by_method = {r.method: r for r in _compare(case, runs, gaps=())}
    plain, fast, short = by_method["plain"], by_method["tokenswift"], by_method["generate"]
    assert (plain.tokens, plain.tokens_per_second, plain.seconds) == (10, 3.75, 3.0)  # medians over the repeats
    assert fast.tokens_per_second == 15.0 and fast.speedup_plain == 4.0 and plain.speedup_plain == 1.0
    assert short.tokens == 4 and not short.complete and short.tokens_per_second == 20.0
    assert short.speedup_plain is None and fast.speedup_generate is None  # never a ratio of different lengths
    assert short.to_plain.label() == "no @4" and fast.to_generate.label() == "no @4"
    text = _table_text(list(by_method.values()))
    assert "4 of 10" in text and "generate wrote 4 of 10 tokens" in text
    write_results(tmp_path, "r", list(by_method.values()), {}, plot=False)
    rows = {row["method"]: row for row in csv.DictReader((tmp_path / "r.csv").open())}
    assert (rows["tokenswift"]["tokens"], rows["tokenswift"]["tokens_per_second"]) == ("10", "15.0")
    assert (rows["generate"]["complete"], rows["tokenswift"]["speedup_plain"]) == ("False", "4.0")
    saved = {r["method"]: r for r in json.loads((tmp_path / "r.json").read_text())["results"]}
    assert saved["generate"]["tokens"] == 4 and saved["generate"]["complete"] is False
    assert saved["tokenswift"]["tokens_per_second"] == 15.0 and saved["tokenswift"]["speedup_plain"] == 4.0


def test_the_table_says_why_generate_is_not_compared() -> None:
    target = Target(quick_model())
    greedy = RunConfig(max_new_tokens=8, sampling=SamplingConfig(), kv_cache="model")
    assert generate_gaps(greedy, target, context=32) == ()
    rules = dataclasses.replace(EMBEDDED, temperature=0.0, scripts=("latin",))
    assert Equality(gaps=generate_gaps(greedy.replace(sampling=rules), target, 32)).label() == (
        "n/a (extra rules: dry, scripts, spacing, word cap, capitals cap)"
    )
    assert Equality(gaps=generate_gaps(greedy.replace(sampling=PAPER), target, 32)).label() == "n/a (sampled)"
    short_penalty = SamplingConfig(penalty=1.2, penalty_window=16)
    assert generate_gaps(greedy.replace(sampling=short_penalty), target, 32) == ("penalty window",)
    assert generate_gaps(greedy.replace(sampling=short_penalty), target, 8) == ()  # the window holds the text
    windowed = greedy.replace(window=ContextWindow(size=16), kv_cache="float16")
    assert generate_gaps(windowed, target, 32) == ("context window", "float16 KV cache")


@pytest.fixture(scope="module")
def eos_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny word-level model, its end-of-text token (id 1, in its generation config) made likely:
    `generate()` with `eos_token_id=None` stops early on it (the model's own config brings it back)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    folder = build_tiny_folder(tmp_path_factory.mktemp("eos-llama"))
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    ids = torch.tensor([AutoTokenizer.from_pretrained(folder)(PREFIX)["input_ids"]])
    with one_thread(), torch.no_grad():
        config = GenerationConfig(max_new_tokens=24, eos_token_id=None, pad_token_id=0, do_sample=False)
        greedy = model.generate(ids, generation_config=config)[0, ids.shape[1] :].tolist()
        weight = model.get_output_embeddings().weight
        weight[1] = 1.5 * weight[greedy[5]]  # the end-of-text token wins where that token did
        stopped = model.generate(ids, generation_config=config)[0, ids.shape[1] :].tolist()
    assert model.generation_config.eos_token_id == 1 and len(stopped) < 24  # the bug this bench avoids
    model.save_pretrained(folder)
    (folder / "prefix.txt").write_text(PREFIX, encoding="utf-8")
    return folder


def _folder_request(folder: Path, **changes: Any) -> BenchRequest:
    options: dict[str, Any] = {"model": str(folder), "heads": "none", "prefix_file": folder / "prefix.txt",
                               "lengths": (24,), "length_context": 40, "contexts": (), **changes}  # fmt: skip
    return BenchRequest(**options)


def test_greedy_bench_holds_generate_to_the_length_and_reports_equality(eos_folder: Path, tmp_path: Path) -> None:
    methods = ("plain", "tokenswift", "generate", "prompt_lookup")
    request = _folder_request(eos_folder, methods=methods, sampling="greedy")
    with one_thread():
        results, _ = run_bench(request, out_dir=tmp_path, name="g")
    assert [(r.method, r.tokens, r.complete) for r in results] == [(m, 24, True) for m in methods]
    by_method = {r.method: r for r in results}
    for method in ("plain", "tokenswift"):  # the engine's greedy text is generate()'s, token for token
        assert by_method[method].equal_to_generate and by_method[method].to_generate.label() == "yes"
    assert by_method["generate"].equal_to_plain and by_method["prompt_lookup"].equal_to_generate
    assert all(r.speedup_generate is not None for r in results)
    document = json.loads((tmp_path / "g.json").read_text())["settings"]
    assert document["run_config"]["sampling"]["suppress_token_ids"] == [1]  # generate() suppresses them too
    assert document["cases"][0]["window"] is None and document["cases"][0]["kv_cache"] == "float32"
    assert "= generate()" in _table_text(results)
    sampled = run_bench(_folder_request(eos_folder, methods=methods[:3]), out_dir=tmp_path, name="s")[0]
    assert [r.tokens for r in sampled] == [24, 24, 24]
    assert {r.to_generate.label() for r in sampled[:2]} == {"n/a (sampled)"}


def test_bench_defaults_are_writes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The bench command's defaults build the settings `tokenswift write` builds from its own, before any model."""
    captured: dict[str, Any] = {}
    monkeypatch.setattr(runner, "write", lambda **kwargs: captured.update(kwargs) or 0)
    monkeypatch.setattr(  # run_bench returns (results, files written)
        "tokenswift_cli.bench.run.run_bench", lambda request, **_: captured.update(bench=request) or ([], [])
    )
    prefix = tmp_path / "prefix.txt"
    prefix.write_text(PREFIX, encoding="utf-8")
    assert cli("write", "--prefix", prefix, "--tokens", "2k").exit_code == 0
    assert cli("bench", "-o", tmp_path).exit_code == 0
    request: BenchRequest = captured["bench"]
    assert request == BenchRequest()
    bench = request.run_config()
    assert bench == captured["config"].replace(max_new_tokens=bench.max_new_tokens)
    assert request.model_spec() == captured["model"]
    assert bench.sampling == EMBEDDED and bench.kv_cache == "auto" and request.model_spec().weights == "auto"


def test_bench_resolves_the_model_and_settings_as_write_does(eos_folder: Path) -> None:
    """A write of 24 tokens after the prefix records the settings the bench runs its case with."""
    with one_thread():
        written = cli("write", "-p", eos_folder / "prefix.txt", "-n", 24, "-m", eos_folder, "--heads", "none", "-q")
    assert written.exit_code == 0, written.output
    settings = json.loads((run_dir() / "settings.json").read_text())
    opened = open_model(_folder_request(eos_folder))
    request = _folder_request(eos_folder)
    bench = Bench(opened.target, opened.heads, request.settings(opened.run))
    resolved = bench.config("tokenswift", request.cases()[0])
    assert json.loads(json.dumps(resolved.to_dict())) == settings["run_config"]
    assert opened.model.settings["spec"] == settings["model"]["spec"]
