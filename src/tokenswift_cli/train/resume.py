"""Where a heads training run stands, saved so that an interrupted run continues to the same result.

The state file holds the heads, the optimizer, the step, the data cursor (this epoch's order of
the rows and the position in it), the generator that shuffles the next epochs and the running
averages: everything the loop reads. It is keyed by the settings that shape the run, so a state
written for other settings or other rows is refused rather than silently mixed in.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from tokenswift_cli.config import ConfigError


class StateMismatch(ConfigError):
    """The state file was written by a run with other settings or rows; the message is meant for the user."""


@dataclass
class LoopState:
    """The loop's position: mutable, advanced by the loop, saved at checkpoints."""

    order: torch.Tensor  # [N] this epoch's order of the rows
    generator: torch.Generator
    cursor: int = 0
    step: int = 0
    loss_avg: float = 0.0
    top1_avg: torch.Tensor = field(default_factory=lambda: torch.zeros(0))

    @classmethod
    def start(cls, rows: int, heads: int, seed: int) -> LoopState:
        generator = torch.Generator().manual_seed(seed)
        return cls(torch.randperm(rows, generator=generator), generator, top1_avg=torch.zeros(heads))

    def next_indices(self, batch: int) -> torch.Tensor:
        """The rows of the next batch; a new epoch (a new order) when this one has too few left."""
        if self.cursor + batch > self.order.numel():
            self.order, self.cursor = torch.randperm(self.order.numel(), generator=self.generator), 0
        index = self.order[self.cursor : self.cursor + batch]
        self.cursor += batch
        return index


def run_key(settings: dict[str, object]) -> str:
    """Names a run by what determines its result (settings, data size, the rows' digest)."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]


def save_state(
    path: Path, key: str, loop: LoopState, module: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> None:
    """Write the state atomically (temp file, rename): a crash while writing keeps the previous one."""
    state = {
        "key": key,
        "heads": module.state_dict(),
        "optimizer": optimizer.state_dict(),
        "order": loop.order,
        "generator": loop.generator.get_state(),
        "cursor": loop.cursor,
        "step": loop.step,
        "loss_avg": loop.loss_avg,
        "top1_avg": loop.top1_avg.cpu(),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def load_state(path: Path, key: str, module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> LoopState:
    """Restore the heads and the optimizer from `path` in place; returns the loop's position."""
    state = torch.load(path, map_location="cpu", weights_only=True)
    if state["key"] != key:
        raise StateMismatch(f"{path} was written by a run with other settings or data: --fresh starts over")
    module.load_state_dict(state["heads"])
    optimizer.load_state_dict(state["optimizer"])  # moves its tensors to the parameters' device
    generator = torch.Generator()
    generator.set_state(state["generator"])
    return LoopState(state["order"], generator, state["cursor"], state["step"], state["loss_avg"], state["top1_avg"])
