"""Distinct-1 and -2 of runs' texts per 10K-token window: over every window, and over the windows without
a degenerate 500-token stretch (`quality.text`), so that garbage (one-off tokens, which raise Distinct-1)
does not count as variety. For comparing settings on the same seeds (docs/quality.md, issue 43).

    python benchmarks/clean_distinct.py RUN_DIR [RUN_DIR ...] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from tokenswift_cli.config import ModelSpec
from tokenswift_cli.model.loading import load_model
from tokenswift_cli.quality.text import STRETCH_TOKENS, distinct_n, stretches

WINDOW = 10_000


def measure(text: str, tokenizer) -> dict:  # type: ignore[no-untyped-def]
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    bad = {s.start // STRETCH_TOKENS for s in stretches(ids, tokenizer) if s.degenerate}
    every, clean = [], []
    for start in range(0, len(ids) - WINDOW + 1, WINDOW):
        window = ids[start : start + WINDOW]
        pair = (distinct_n(window, 1), distinct_n(window, 2))
        every.append(pair)
        if not any(i in bad for i in range(start // STRETCH_TOKENS, (start + WINDOW) // STRETCH_TOKENS)):
            clean.append(pair)

    def mean(pairs: list[tuple[float, float]], n: int) -> float | None:
        return statistics.mean(p[n] for p in pairs) if pairs else None

    return {"windows": len(every), "clean_windows": len(clean), "distinct": [mean(every, 0), mean(every, 1)],
            "clean_distinct": [mean(clean, 0), mean(clean, 1)]}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run folders (their text.txt)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    tokenizer = load_model(ModelSpec()).tokenizer
    rows = {}
    print("| run | windows | Distinct-1, -2 | clean windows | Distinct-1, -2 over them |")
    print("| --- | --- | --- | --- | --- |")
    for run in args.runs:
        row = rows[str(run)] = measure((run / "text.txt").read_text(encoding="utf-8"), tokenizer)
        shown = ["-" if x is None else f"{x:.3f}" for x in (*row["distinct"], *row["clean_distinct"])]
        print(
            f"| {run} | {row['windows']} | {shown[0]}, {shown[1]} | {row['clean_windows']} | {shown[2]}, {shown[3]} |"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
