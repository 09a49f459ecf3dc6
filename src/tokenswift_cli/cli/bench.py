"""`tokenswift bench`: plain decoding, TokenSwift, `generate()`, prompt lookup and llama.cpp side by side.

Thin: parses the options into `BenchSettings` and calls `bench_models.run_bench`; torch is imported
only when the command runs.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Annotated

import typer

from tokenswift_cli.cli.errors import hidden_cache_rename
from tokenswift_cli.cli.help import Command
from tokenswift_cli.parsing import parse_keep, resolve_device

EXAMPLE = "Example: tokenswift bench --lengths 512,2k --contexts 2k,8k --sampling greedy --out results/"


def parse_count(text: str) -> int:
    """`512`, `2k` (= 2048, as context sizes are counted), `1.5k`."""
    text = text.strip()
    try:
        if text[-1:] in ("k", "K"):
            return int(float(text[:-1]) * 1024)
        return int(text)
    except ValueError:
        raise typer.BadParameter(f"not a token count: {text!r} (e.g. 512, 2k)") from None


def parse_counts(text: str) -> list[int]:
    return [parse_count(part) for part in text.split(",") if part.strip()]


# parse_count's k is 1,024 (context sizes), not write's 1,000: the help says which.
_K = "k = 1,024"
_HELP_LENGTHS = f"Generated lengths for the length axis (prefix: --length-context tokens), e.g. 2k,8k,16k ({_K})."
_HELP_CONTEXTS = f"Prefix lengths for the context axis (then --context-tokens new tokens), e.g. 2k,8k,32k ({_K})."
_HELP_OUT = (
    "Folder for the results: JSON and CSV, and a PNG plot where matplotlib is installed (pip install matplotlib)."
)
_HELP_SAMPLING = (
    "default (as write: the model's measured defaults), paper (T=1, min-p 0.1, penalty 1.2 / 1024) or greedy "
    "(argmax with only the rules generate() implements: its text can equal the engine's, column '= generate()')."
)
_HELP_WINDOW = (
    "The engine's context window: auto, none or a size such as 4k. Default: auto (as write), none under "
    "--sampling greedy (generate() attends to everything)."
)
_HELP_KV = (
    "The engine's KV cache storage: auto, model, float16 or int8. Default: auto (as write), model under "
    "--sampling greedy (as generate() stores it)."
)


def bench_command(
    model: Annotated[
        str, typer.Option("--model", "-m", help="'default', a model folder, a .gguf file or a hub id.")
    ] = "default",
    device: Annotated[
        str | None,
        typer.Option(help="cpu or cuda[:N] (default: cuda where a GPU is present); on cuda the files name the GPU."),
    ] = None,
    dtype: Annotated[
        str, typer.Option(help="auto (as write: the model's), float32 or bfloat16; every method uses the same.")
    ] = "auto",
    weights: Annotated[
        str,
        typer.Option(
            help="auto (as write: 4-bit on a CPU when the model already is, e.g. the embedded one), dense or int4 "
            "(4-bit linear layers); every method uses the same."
        ),
    ] = "auto",
    heads: Annotated[str, typer.Option(help="Draft heads: 'default' (shipped), 'none', or a file.")] = "default",
    lengths: Annotated[str, typer.Option(help=_HELP_LENGTHS)] = "512,2k",
    length_context: Annotated[str, typer.Option(help=f"Prefix tokens of the length axis ({_K}).")] = "256",
    contexts: Annotated[str, typer.Option(help=_HELP_CONTEXTS)] = "2k,8k",
    context_tokens: Annotated[str, typer.Option(help=f"Tokens generated per context-axis case ({_K}).")] = "256",
    prefix_file: Annotated[Path | None, typer.Option(help="Text whose first N tokens are the prefix.")] = None,
    methods: Annotated[
        str,
        typer.Option(
            help="Among plain,tokenswift,generate,generate_compiled,prompt_lookup,llama_cpp; auto: all but "
            "llama_cpp and generate_compiled, llama_cpp too when llama-cpp-python is installed and the model is a "
            "GGUF file; on cuda generate_compiled (static cache + torch.compile) instead of prompt_lookup."
        ),
    ] = "auto",
    sampling: Annotated[str, typer.Option(help=_HELP_SAMPLING)] = "default",
    seed: Annotated[int, typer.Option(help="Seed of the position-keyed random stream.")] = 0,
    draft: Annotated[
        str, typer.Option(help="TokenSwift drafting: auto, pass (paper), verify (Medusa-style), ngram or lookup.")
    ] = "auto",
    tree: Annotated[str | None, typer.Option(help="Tree template, e.g. 1,3,3,3 (default: the engine's).")] = None,
    ngram_top_k: Annotated[int | None, typer.Option(help="N-gram candidates per key; 0 = off.")] = None,
    repeats: Annotated[int, typer.Option(min=1, help="Interleaved repeats per case (median time).")] = 1,
    threads: Annotated[int | None, typer.Option(help="torch threads (default: torch's choice).")] = None,
    out: Annotated[Path, typer.Option("--out", "-o", help=_HELP_OUT)] = Path("."),
    name: Annotated[str, typer.Option(help="Base name of the result files.")] = "bench",
    quick: Annotated[
        bool,
        typer.Option(
            "--quick",
            help="A tiny random model instead of --model: checks the setup. The default cases still take minutes "
            "on a CPU; with --lengths 256 --contexts '' it ends in about a minute.",
        ),
    ] = False,
    context_window: Annotated[str | None, typer.Option(help=_HELP_WINDOW, show_default=False)] = None,
    keep: Annotated[
        str,
        typer.Option(
            "--keep", "--sinks", help="First prefix tokens kept in view under --context-window, or 'prompt' (all)."
        ),
    ] = "4",
    kv_cache: Annotated[str | None, typer.Option(help=_HELP_KV, show_default=False)] = None,
) -> None:
    """Measure plain decoding, TokenSwift, generate(), prompt lookup and llama.cpp on the same prefixes, interleaved."""
    from tokenswift_cli.bench.models import BenchRequest
    from tokenswift_cli.bench.run import run_bench

    try:
        request = BenchRequest(
            model=model, device=resolve_device(device), dtype=dtype, weights=weights, heads=heads,
            lengths=tuple(parse_counts(lengths)),
            length_context=parse_count(length_context), contexts=tuple(parse_counts(contexts)),
            context_tokens=parse_count(context_tokens), prefix_file=prefix_file,
            methods=None if methods == "auto" else tuple(m.strip() for m in methods.split(",") if m.strip()),
            sampling=sampling, seed=seed,
            draft=draft, tree=tree, ngram_top_k=ngram_top_k, repeats=repeats, threads=threads, quick=quick,
            context_window=context_window, keep=parse_keep(keep), kv_cache=kv_cache,
        )  # fmt: skip
        with hidden_cache_rename():
            _, written = run_bench(request, out_dir=out, name=name)
    except ValueError as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(2) from None
    if not any(path.suffix == ".png" for path in written) and importlib.util.find_spec("matplotlib") is None:
        typer.echo("no plot: matplotlib is not installed (pip install matplotlib)", err=True)


def register(app: typer.Typer) -> None:
    """Add the `bench` command to the main app."""
    app.command("bench", cls=Command, epilog=EXAMPLE)(bench_command)
