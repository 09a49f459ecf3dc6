"""The target's scores on the device, without the host: what the walk and the drafts' ranking run there.

`distribution.target_scores` reads the context on the host for the filters (the scripts filter's
state is the incomplete character the text ends with, the spacing rule's its last character) and
DRY's matches. Here the filters' masks come from per-device tables, one row per state (`MaskTable`),
picked by an index the host computed (it knows every context the device will score), and DRY runs
over every position (`dry_penalties_on_device`); both then score through `distribution.scored`, so the
scores are the same, bit for bit (tests/test_walk.py).
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import torch

from tokenswift_cli.config import SamplingConfig
from tokenswift_cli.sampling import distribution
from tokenswift_cli.sampling.dry import dry_penalties_on_device


def scores_on_device(
    row: torch.Tensor, context: torch.Tensor, cfg: SamplingConfig, suppress: torch.Tensor,
    banned: Sequence[torch.Tensor],
) -> torch.Tensor:  # fmt: skip
    """`target_scores` of float32 logits `row` after `context`, both on the device, the filters' masks given."""
    return distribution.scored(row, context, cfg, suppress=suppress, banned=banned, dry=dry_penalties_on_device)


class MaskTable:
    """A filter's banned masks `[states, vocab]` on one device, one row per state met so far (a few)."""

    _tables: weakref.WeakKeyDictionary[Any, dict[torch.device, MaskTable]] = weakref.WeakKeyDictionary()

    def __init__(self, rule: Any, device: torch.device) -> None:
        self.rule, self.device = rule, device
        self.states: dict[Any, int] = {}
        self.masks = torch.zeros(0, 0, dtype=torch.bool, device=device)

    @classmethod
    def of(cls, rule: Any, device: torch.device) -> MaskTable:
        """The table of `rule` on `device`, kept while the rule lives (a run's filters)."""
        per_device = cls._tables.setdefault(rule, {})
        if device not in per_device:
            per_device[device] = cls(rule, device)
        return per_device[device]

    def row(self, context: Sequence[int]) -> int:
        """The row of the mask that follows `context` (its last tokens), added if new."""
        state = self.rule.state(context)
        if state not in self.states:
            mask = self.rule.banned_after(state).to(self.device)[None]
            self.masks = mask if not self.states else torch.cat([self.masks, mask])
            self.states[state] = len(self.states)
        return self.states[state]
