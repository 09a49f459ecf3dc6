"""Where tokenswift keeps its files. Nothing is created here: callers `mkdir` when they write."""

from __future__ import annotations

import os
from pathlib import Path


def _from_env(name: str) -> Path | None:
    # An empty variable counts as unset, as in the XDG specification.
    value = os.environ.get(name, "").strip()
    return Path(value).expanduser().absolute() if value else None


def home_dir() -> Path:
    """Runs and trained heads: `$TOKENSWIFT_HOME`, else `$XDG_DATA_HOME/tokenswift`, else ~/.local/share."""
    base = _from_env("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return _from_env("TOKENSWIFT_HOME") or base / "tokenswift"


def cache_dir() -> Path:
    """Data that can be rebuilt (converted models): `$TOKENSWIFT_CACHE`, else `$XDG_CACHE_HOME/tokenswift`."""
    base = _from_env("XDG_CACHE_HOME") or Path.home() / ".cache"
    return _from_env("TOKENSWIFT_CACHE") or base / "tokenswift"
