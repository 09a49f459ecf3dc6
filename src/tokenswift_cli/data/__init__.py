"""Files that ship inside the package: the embedded model's draft heads and public-domain texts."""

from __future__ import annotations

from pathlib import Path

DATA = Path(__file__).resolve().parent
HEADS = DATA / "heads"
TEXTS = DATA / "texts"
DEFAULT_TEXT = TEXTS / "milton-paradise-lost.txt"
# Held out: no training reads it (`train-heads --data` refuses it), so heads are measured on it.
HELD_OUT_TEXT = DEFAULT_TEXT
