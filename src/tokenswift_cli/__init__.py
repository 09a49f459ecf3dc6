"""tokenswift: write very long texts faster than plain decoding, losslessly (TokenSwift).

The public API is small: `write()` and `resume()` (what the CLI runs), and the settings dataclasses.
Heavy modules (torch, transformers) load on first use, so importing the package stays instant.
"""

from __future__ import annotations

from importlib import import_module, metadata
from typing import Any

try:
    __version__ = metadata.version("tokenswift-cli")
except metadata.PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0"

_LAZY = {
    "write": "runs.runner",
    "resume": "runs.runner",
    "Output": "runs.runner",
    "RunConfig": "config",
    "SamplingConfig": "config",
    "DraftConfig": "config",
    "ModelSpec": "config",
    "ConfigError": "config",
    "generate": "engine.decode",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
