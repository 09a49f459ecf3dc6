"""Files that ship inside the package: the embedded model's draft heads and public-domain texts."""

from __future__ import annotations

from pathlib import Path

DATA = Path(__file__).resolve().parent
HEADS = DATA / "heads"
TEXTS = DATA / "texts"
DEFAULT_TEXT = TEXTS / "milton-paradise-lost.txt"
