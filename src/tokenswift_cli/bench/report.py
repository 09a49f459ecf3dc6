"""Presentation of benchmark results: a Rich table, JSON, CSV and (with matplotlib) a PNG plot."""

from __future__ import annotations

import csv
import json
import os
import platform
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tokenswift_cli.bench.compare import Equality
from tokenswift_cli.bench.harness import Result

CSV_FIELDS = (
    "axis", "context", "new_tokens", "method", "tokens", "complete", "seconds", "tokens_per_second", "ms_per_token",
    "speedup_plain", "speedup_generate", "alpha", "mean_accepted", "beta",
    "distinct_1", "distinct_2", "distinct_3", "distinct_4", "peak_rss_mb", "equal_to_plain", "first_divergence",
    "not_compared_to_plain", "equal_to_generate", "generate_divergence", "not_compared_to_generate",
)  # fmt: skip
COLUMNS = ("context", "new", "method", "tokens", "tok/s", "ms/tok", "x plain", "x generate", "alpha", "acc len",
           "beta", "distinct-1..4", "peak MB", "= plain", "= generate()")  # fmt: skip
LEFT = ("method", "distinct-1..4", "= plain", "= generate()")
NOTE = ("x plain, x generate: tokens/s over theirs, on runs of the full length. = generate(): the engine's text "
        "against transformers' generate() with the same settings; n/a where it differs by design (sampled: "
        "another random stream; extra rules: what generate() does not implement). --sampling greedy compares "
        "them with only generate()'s rules. alpha (drafts accepted per draft slot, over the steps that drafted), "
        "acc len (tokens per step, over all steps) and beta (accepted n-gram drafts per slot) are TokenSwift's: - for "
        "the other methods; x plain, x generate: - "
        "where either run wrote fewer tokens than asked.")  # fmt: skip


def _fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _same(equality: Equality, itself: bool, *, reasons: bool = True) -> str:
    """The equality cell: blank for the method itself, green yes, red no @i, dim n/a (reasons)."""
    if itself:
        return ""
    label = "n/a" if equality.gaps and not reasons else equality.label()
    style = "green" if equality.equal else "red" if equality.equal is False else "dim"
    return label if label == "-" else f"[{style}]{label}[/]"


def _tokens(result: Result) -> str:
    if result.complete:
        return str(result.tokens)
    return f"[red]{result.tokens} of {result.case.new_tokens}[/]"


def render_table(results: Sequence[Result], title: str = "tokenswift bench") -> Any:
    """A Rich table, one row per case and method; short runs flagged in the caption."""
    from rich.table import Table

    short = [f"{r.method} wrote {r.tokens} of {r.case.new_tokens} tokens" for r in results if not r.complete]
    caption = NOTE + ("" if not short else " [red]Short, left out of the speedups: " + "; ".join(short) + ".[/]")
    table = Table(title=title, caption=caption, caption_justify="left")
    for name in COLUMNS:
        table.add_column(name, justify="left" if name in LEFT else "right")
    for r in results:
        table.add_row(
            str(r.case.context), str(r.case.new_tokens), r.method, _tokens(r), _fmt(r.tokens_per_second),
            _fmt(r.ms_per_token, 1), _fmt(r.speedup_plain), _fmt(r.speedup_generate), _fmt(r.alpha),
            _fmt(r.mean_accepted), _fmt(r.beta), "/".join(f"{d:.2f}" for d in r.distinct), _fmt(r.peak_rss_mb, 0),
            # generate()'s reasons against plain are plain's against generate(), a row above
            _same(r.to_plain, r.method == "plain", reasons=False), _same(r.to_generate, r.method == "generate"),
        )  # fmt: skip
    return table


def csv_row(result: Result) -> dict[str, Any]:
    data = result.to_dict()
    case = data.pop("case")
    row = {**case, **data}
    for n, value in enumerate(result.distinct, start=1):
        row[f"distinct_{n}"] = value
    for key in ("not_compared_to_plain", "not_compared_to_generate"):
        row[key] = ";".join(row[key])
    return {k: row.get(k) for k in CSV_FIELDS}


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    import torch

    return {
        "platform": platform.platform(), "processor": platform.processor(), "cpus": os.cpu_count(),
        "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
        "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
    }  # fmt: skip


def write_results(
    out_dir: Path, name: str, results: Sequence[Result], settings: dict[str, Any], *, plot: bool = True
) -> list[Path]:
    """`name`.json (settings, machine, results), `name`.csv and, when matplotlib is installed, `name`.png."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, csv_path = out_dir / f"{name}.json", out_dir / f"{name}.csv"
    document = {"settings": settings, "machine": machine(), "results": [r.to_dict() for r in results]}
    json_path.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    with csv_path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=CSV_FIELDS)
        writer.writeheader()
        writer.writerows(csv_row(r) for r in results)
    written = [json_path, csv_path]
    png = write_plot(out_dir / f"{name}.png", results) if plot else None
    return written + ([png] if png else [])


def write_plot(path: Path, results: Sequence[Result]) -> Path | None:
    """Speedup over plain and alpha against generated length and context length (the paper's figures)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    axes_names = [a for a in ("length", "context") if any(r.case.axis == a for r in results)]
    if not axes_names:
        return None
    fig, grid = plt.subplots(2, len(axes_names), figsize=(5.5 * len(axes_names), 7), squeeze=False)
    for col, axis in enumerate(axes_names):
        rows = [r for r in results if r.case.axis == axis]
        x_of = (lambda r: r.case.new_tokens) if axis == "length" else (lambda r: r.case.context)
        label = "generated tokens" if axis == "length" else "context tokens (prefix)"
        for method in dict.fromkeys(r.method for r in rows):
            points = sorted((x_of(r), r.speedup_plain or 0.0) for r in rows if r.method == method)
            grid[0][col].plot(*zip(*points, strict=True), marker="o", label=method)
        alphas = sorted((x_of(r), r.alpha) for r in rows if r.alpha is not None)
        if alphas:
            grid[1][col].plot(*zip(*alphas, strict=True), marker="s", color="tab:orange", label="alpha")
        grid[0][col].set(xscale="log", xlabel=label, ylabel="speedup over plain", title=f"speedup vs {axis}")
        grid[0][col].axhline(1.0, color="grey", linewidth=0.8)
        grid[1][col].set(xscale="log", xlabel=label, ylabel="alpha (TokenSwift)", ylim=(0, 1))
        ticks = sorted({x_of(r) for r in rows})
        for ax in (grid[0][col], grid[1][col]):
            ax.set_xticks(ticks, [str(t) for t in ticks])
            ax.minorticks_off()
        grid[0][col].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
