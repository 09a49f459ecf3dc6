"""What one forward of the target model gives back, whichever backend ran it."""

from __future__ import annotations

from dataclasses import dataclass

import torch


class QueryCapture:
    """Collects, per layer, the (rotated) query of one row of a forward: it scores keys for the partial cache."""

    def __init__(self, row: int) -> None:
        self.row = row
        self.queries: dict[int, torch.Tensor] = {}

    def ordered(self) -> list[torch.Tensor]:
        return [self.queries[i] for i in sorted(self.queries)]


@dataclass(frozen=True)
class Forward:
    """Hidden states of one forward: `pre_norm` feeds the heads, `hidden` (post-norm) the lm_head."""

    pre_norm: torch.Tensor  # [q, hidden]
    hidden: torch.Tensor  # [q, hidden]
