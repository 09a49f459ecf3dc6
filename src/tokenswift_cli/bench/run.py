"""A bench request end to end: open the model, run every case, print the table, write the result files."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import torch

from tokenswift_cli.bench.harness import Bench, BenchSettings, Result
from tokenswift_cli.bench.llamacpp import LlamaCpp, gguf_file
from tokenswift_cli.bench.models import BenchModel, BenchRequest, open_model
from tokenswift_cli.engine.state import kv_storage


def run_bench(request: BenchRequest, *, out_dir: Path, name: str) -> tuple[list[Result], list[Path]]:
    """Run every case, print a Rich table to stderr, write the result files; returns both."""
    from rich.console import Console

    from tokenswift_cli.bench.report import render_table, write_results

    console = Console(stderr=True, width=None if sys.stderr.isatty() else 200)
    name = device_name(request.device, name)
    request.settings(request.run_config())  # every option checked before the model loads
    if request.threads:
        torch.set_num_threads(request.threads)
    opened = open_model(request, note=lambda text: console.print(f"[dim]{text}[/]"))
    settings = request.settings(opened.run)
    bench = Bench(opened.target, opened.heads, settings, _llama(request, settings))
    document = _document(request, opened, bench)
    done: list[Result] = []

    def progress(result: Result) -> None:
        console.print(f"[dim]{result.case.axis} ctx={result.case.context} new={result.case.new_tokens} "
                      f"{result.method}: {result.tokens} tokens, {result.tokens_per_second:.2f} tok/s[/]")  # fmt: skip
        done.append(result)
        write_results(out_dir, name, done, document, plot=False)  # a long run keeps what it measured

    results = bench.run(opened.prefix, on_result=progress)
    dtype, weights = str(opened.target.dtype).removeprefix("torch."), opened.model.settings["spec"]["weights"]
    label = opened.model.settings["label"]
    title = f"tokenswift bench ({label}, {dtype}, {weights} weights, {request.sampling} sampling)"
    console.print(render_table(results, title=title))
    paths = write_results(out_dir, name, results, document)
    console.print("wrote " + ", ".join(str(p) for p in paths))
    return results, paths


def device_name(device: str, name: str) -> str:
    """`name`, with the GPU's name appended on CUDA (bench-nvidia-h100-80gb-hbm3): results say where they ran."""
    if not device.startswith("cuda") or not torch.cuda.is_available():
        return name
    gpu = torch.cuda.get_device_name(torch.device(device))
    return f"{name}-" + "-".join("".join(c if c.isalnum() else " " for c in gpu.lower()).split())


def device_info(device: str) -> dict[str, Any]:
    """The device a bench ran on, and on CUDA the GPU and the batch-invariance settings in force."""
    if not device.startswith("cuda") or not torch.cuda.is_available():
        return {"device": device}
    from tokenswift_cli.backends.cuda import invariance

    gpu = torch.device(device)
    return {"device": device, "gpu": torch.cuda.get_device_name(gpu), "torch": torch.__version__,
            "cuda": torch.version.cuda, "invariance": invariance.settings()}  # fmt: skip


def _document(request: BenchRequest, opened: BenchModel, bench: Bench) -> dict[str, Any]:
    """What the results were measured with: the request, the resolved model and engine settings per case."""
    target, cases = opened.target, []
    for case in bench.settings.cases:
        config = bench.config("tokenswift", case)
        window = config.context_window
        cases.append({**dataclasses.asdict(case), "window": dataclasses.asdict(window) if window else None,
                      "kv_cache": str(kv_storage(config, target)).removeprefix("torch.")})  # fmt: skip
    return {
        "request": {k: str(v) if isinstance(v, Path) else v for k, v in dataclasses.asdict(request).items()},
        "model": opened.model.settings, "heads": opened.model.heads_settings, "run_config": opened.run.to_dict(),
        "cases": cases, "command": " ".join(["tokenswift", *sys.argv[1:]]), "device": device_info(request.device),
    }  # fmt: skip


def _llama(request: BenchRequest, settings: BenchSettings) -> LlamaCpp | None:
    """llama.cpp on the model's GGUF file, sized for the longest case, when the methods name it."""
    if "llama_cpp" not in settings.methods:
        return None
    if request.quick:
        raise ValueError("the llama_cpp method runs GGUF models, not the --quick tiny model")
    longest = max(case.context + case.new_tokens for case in settings.cases)
    threads = request.threads or torch.get_num_threads()
    return LlamaCpp(gguf_file(request.model), context=longest + 8, threads=threads, sampling=settings.sampling)
