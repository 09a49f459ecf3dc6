"""Distinct-1 and -2 of runs' texts per 10K-token window: over every window, and over the windows without
a degenerate 500-token stretch (`quality.text`), so that garbage (one-off tokens, which raise Distinct-1)
does not count as variety; and Distinct-1 over words, per window of 5,000 words, English ones (in
wordfreq's lexicon, the `quality` extra) apart from the rest, so that variety counts in words a reader
knows, whatever the tokens that spell them. For comparing settings on the same seeds (docs/quality.md,
issue 43).

    pip install -e '.[quality]'   # wordfreq, for the word columns
    python benchmarks/clean_distinct.py RUN_DIR [RUN_DIR ...] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from collections.abc import Callable
from functools import cache
from pathlib import Path

from tokenswift_cli.config import ModelSpec
from tokenswift_cli.model.loading import load_model
from tokenswift_cli.quality.text import STRETCH_TOKENS, distinct_n, stretches

WINDOW = 10_000
WORD_WINDOW = 5_000
_WORD = re.compile(r"[a-z]+(?:'[a-z]+)?")
LEXICON_ZIPF = 1.0  # wordfreq's scale: log10 of uses per billion words; 1.0 keeps words used once in 100M


def english_lexicon() -> Callable[[str], bool]:
    """Whether a lower-cased word is English, by wordfreq's frequency lists."""
    try:
        from wordfreq import zipf_frequency
    except ImportError:
        sys.exit("error: the word columns need wordfreq: pip install -e '.[quality]'")
    return cache(lambda word: zipf_frequency(word, "en") >= LEXICON_ZIPF)


def word_distinct(text: str, is_english: Callable[[str], bool]) -> list[tuple[float, float]]:
    """Per window of `WORD_WINDOW` words: (distinct English words, distinct other words) over the window's words."""
    words = _WORD.findall(text.lower())
    windows = []
    for start in range(0, len(words) - WORD_WINDOW + 1, WORD_WINDOW):
        distinct = set(words[start : start + WORD_WINDOW])
        english = sum(map(is_english, distinct))
        windows.append((english / WORD_WINDOW, (len(distinct) - english) / WORD_WINDOW))
    return windows


def measure(text: str, tokenizer, is_english: Callable[[str], bool]) -> dict:  # type: ignore[no-untyped-def]
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    words = word_distinct(text, is_english)
    bad = {s.start // STRETCH_TOKENS for s in stretches(ids, tokenizer) if s.degenerate}
    every, clean = [], []
    for start in range(0, len(ids) - WINDOW + 1, WINDOW):
        window = ids[start : start + WINDOW]
        pair = (distinct_n(window, 1), distinct_n(window, 2))
        every.append(pair)
        if not any(i in bad for i in range(start // STRETCH_TOKENS, (start + WINDOW) // STRETCH_TOKENS)):
            clean.append(pair)

    def mean(rows: list[tuple], n: int) -> float | None:
        return statistics.mean(r[n] for r in rows) if rows else None

    return {"windows": len(every), "clean_windows": len(clean), "distinct": [mean(every, 0), mean(every, 1)],
            "clean_distinct": [mean(clean, 0), mean(clean, 1)],
            "word_windows": len(words), "word_distinct": [mean(words, 0), mean(words, 1)]}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run folders (their text.txt)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    is_english = english_lexicon()
    tokenizer = load_model(ModelSpec()).tokenizer
    rows = {}
    columns = ("run", "windows", "Distinct-1, -2", "clean windows", "Distinct-1, -2 over them",
               "Distinct-1 of words per 5,000: English, other")  # fmt: skip
    print("| " + " | ".join(columns) + " |")
    print("|" + " --- |" * len(columns))
    for run in args.runs:
        row = rows[str(run)] = measure((run / "text.txt").read_text(encoding="utf-8"), tokenizer, is_english)
        shown = ["-" if x is None else f"{x:.3f}" for x in (*row["distinct"], *row["clean_distinct"])]
        print(
            f"| {run} | {row['windows']} | {shown[0]}, {shown[1]} | {row['clean_windows']} | {shown[2]}, {shown[3]} "
            f"| {row['word_distinct'][0]:.3f}, {row['word_distinct'][1]:.4f} |"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
