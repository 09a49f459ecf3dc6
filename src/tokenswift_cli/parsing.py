"""Settings as a person types them: token counts (`2k`), tree templates (`1,3,3,3`), context windows.

Shared by the commands and `bench` (which must not import the command line); each raises a one-line
ConfigError.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

from tokenswift_cli.config import KEEP_ERROR, KEEP_PROMPT, AutoWindow, ConfigError, ContextWindow, Keep
from tokenswift_cli.sampling.defaults import automatic_window

_TOKENS = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*([kKmM]?)")
_MULTIPLIERS = {"": 1, "k": 1_000, "m": 1_000_000}


def parse_tokens(text: str) -> int:
    """A token count: `20000`, `2K`, `1.5k`, `100k`, `1m`. Raises ConfigError on anything else."""
    match = _TOKENS.fullmatch(text.strip().replace("_", ""))
    if match is None:
        raise ConfigError(f"bad token count {text!r}: use a number such as 20000, 2k, 1.5k or 100k")
    try:
        value = Decimal(match.group(1)) * _MULTIPLIERS[match.group(2).lower()]
    except InvalidOperation:
        raise ConfigError(f"bad token count {text!r}") from None
    if value != value.to_integral_value():
        raise ConfigError(f"bad token count {text!r}: it is not a whole number of tokens")
    if value < 1:
        raise ConfigError(f"bad token count {text!r}: it must be at least 1")
    return int(value)


def parse_tree(text: str) -> tuple[int, ...]:
    """A tree template `1,3,3,3` (the width of each level)."""
    try:
        widths = tuple(int(part) for part in text.replace(" ", "").split(","))
    except ValueError:
        raise ConfigError(f"bad tree {text!r}: use widths separated by commas, e.g. 1,3,3,3") from None
    return widths


def parse_keep(text: str) -> Keep:
    """`--keep`: a token count (`4`, `1k`) or "prompt" (the whole prompt)."""
    if text.strip().lower() == KEEP_PROMPT:
        return "prompt"
    try:
        return parse_tokens(text)
    except ConfigError:
        raise ConfigError(f"bad --keep {text!r}: {KEEP_ERROR.removeprefix('--keep ')}") from None


def parse_window(text: str, keep: Keep, model: str = "default") -> ContextWindow | AutoWindow | None:
    """`--context-window`: "auto" (the model's measured default), "none" or a size (the kept tokens not
    included); `keep` as `parse_keep` gives it."""
    choice = text.strip().lower()
    if choice in ("auto", "none"):
        return None if choice == "none" else automatic_window(model, keep)
    size = parse_tokens(text)
    return ContextWindow(size=size, sinks=keep) if isinstance(keep, int) else AutoWindow(keep, size, always=True)


def off_if_zero(value: int | None) -> int | None:
    """0 on the command line turns a feature off; the configs spell off as None."""
    return None if value == 0 else value


def resolve_device(device: str | None) -> str:
    """`--device` as given, else the GPU where there is one (CUDA), else the CPU."""
    if device is not None:
        return device
    import torch  # here: --help and `runs` do not import it

    return "cuda" if torch.cuda.is_available() else "cpu"
