"""DRY ("don't repeat yourself", as in llama.cpp): the penalty of a token that would extend a repeat.

Two versions of the same values, bit for bit: `dry_penalties` finds the repeats' ends first (a host
synchronisation), `dry_penalties_on_device` scores every position (the device walk's). The fused
kernel (backends/cpu/csrc/scores.cpp) reads `dry_amounts`' table, so all three subtract the same amounts.
"""

from __future__ import annotations

import functools

import torch

from tokenswift_cli.config import SamplingConfig

DRY_MAX_MATCH = 64  # longer repeats are penalised as this long


def dry_penalties(context: torch.Tensor, vocab: int, cfg: SamplingConfig) -> torch.Tensor:
    """DRY penalties `[vocab]` for the token after `context` `[n]`.

    Every earlier occurrence of the last token is the end of a candidate repeat; its length is how
    many tokens before it match the ones before the end of the context. The token that followed it
    would extend the repeat: it loses multiplier * base^(length - allowed) when length >= allowed.
    """
    penalties = torch.zeros(vocab, dtype=torch.float32, device=context.device)
    n = context.shape[0]
    if n < 2:
        return penalties
    ends = torch.nonzero(context[:-1] == context[-1]).flatten()  # [m]
    if ends.numel() == 0:
        return penalties
    length = _repeat_lengths(context, ends)  # [m]
    hit = length >= cfg.dry_allowed_length
    if not bool(hit.any()):
        return penalties
    amount = dry_amounts(cfg, context.device)[length[hit]]
    return penalties.scatter_reduce(0, context[ends[hit] + 1], amount, "amax")


def dry_penalties_on_device(context: torch.Tensor, vocab: int, cfg: SamplingConfig) -> torch.Tensor:
    """`dry_penalties` without a host synchronisation: every position is a candidate end, the non-repeats
    add nothing (penalties are positive, combined by max). The same values, bit for bit."""
    penalties = torch.zeros(vocab, dtype=torch.float32, device=context.device)
    n = context.shape[0]
    if n < 2:
        return penalties
    ends = torch.arange(n - 1, device=context.device)  # [n - 1]
    length = _repeat_lengths(context, ends)
    hit = (context[:-1] == context[-1]) & (length >= cfg.dry_allowed_length)
    amount = torch.where(hit, dry_amounts(cfg, context.device)[length], 0.0)
    return penalties.scatter_reduce(0, context[1:], amount, "amax")


def _repeat_lengths(context: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """Per candidate end `[m]`: how many tokens up to it match the ones up to the context's end (capped)."""
    n = context.shape[0]
    back = torch.arange(min(DRY_MAX_MATCH, n - 1), device=context.device)  # [K]
    earlier = ends[:, None] - back[None]  # [m, K]
    same = (earlier >= 0) & (context[earlier.clamp(min=0)] == context[n - 1 - back][None])
    return same.long().cumprod(-1).sum(-1)  # [m]: matching tokens, the last one included


@functools.lru_cache(maxsize=8)
def _dry_amount_table(multiplier: float, base: float, allowed: int, device: str) -> torch.Tensor:
    lengths = torch.arange(DRY_MAX_MATCH + 1, device=device)
    return multiplier * base ** (lengths - allowed).float()  # [max + 1]; lengths below `allowed` are never read


def dry_amounts(cfg: SamplingConfig, device: torch.device) -> torch.Tensor:
    """The penalty per repeat length, computed once: a gather, so both DRY versions give the same bits."""
    assert cfg.dry_multiplier is not None
    return _dry_amount_table(cfg.dry_multiplier, cfg.dry_base, cfg.dry_allowed_length, str(device))
