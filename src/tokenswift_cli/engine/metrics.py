"""Statistics of a run, as the paper measures them: alpha, beta, mean accepted length, tokens/s."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

PHASES = ("prefill", "draft", "candidates", "verify", "accept", "shadow", "commit")
# A GPU runs ahead of the host: a phase's time is its own only if the device is waited for at its end,
# which costs a sync per phase. Off unless profiling; the walk's host sync closes each iteration anyway.
PROFILE = os.environ.get("TOKENSWIFT_PROFILE") == "1"


@dataclass
class Stats:
    """Counters of a run; pure accumulation, JSON-serialisable."""

    iterations: int = 0
    generated: int = 0  # committed tokens after the prefix
    accepted: int = 0  # draft tokens accepted
    accepted_ngram: int = 0  # ... of which on a path the n-gram table proposed
    draft_slots: int = 0  # sum over iterations of the deepest draft the settings allow (K+1)
    # Iterations that drafted (K+1 > 0): alpha is over these; --draft auto runs plain steps where they are
    # faster, which add to `iterations` (tokens per step) but to no slot. None: unknown (a run resumed from
    # a checkpoint written before this count, 2026-11-27).
    drafted_iterations: int | None = 0
    tree_nodes: int = 0  # sum of verified nodes
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))

    @property
    def alpha(self) -> float:
        return self.accepted / self.draft_slots if self.draft_slots else 0.0

    @property
    def beta(self) -> float:
        return self.accepted_ngram / self.draft_slots if self.draft_slots else 0.0

    @property
    def drafted_share(self) -> float | None:
        """The share of iterations that drafted (the others were plain steps); None: unknown."""
        if self.drafted_iterations is None:
            return None
        return self.drafted_iterations / self.iterations if self.iterations else 0.0

    @property
    def mean_accepted(self) -> float:
        """Tokens committed per iteration (accepted drafts + the root)."""
        return self.generated / self.iterations if self.iterations else 0.0

    @property
    def decode_seconds(self) -> float:
        return sum(v for k, v in self.seconds.items() if k != "prefill")

    @property
    def tokens_per_second(self) -> float:
        return self.generated / self.decode_seconds if self.decode_seconds else 0.0

    @contextmanager
    def phase(self, name: str, device: torch.device | None = None) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            if PROFILE and device is not None and device.type == "cuda":
                torch.cuda.synchronize(device)
            # .get: a run resumed from an older checkpoint may lack a phase
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

    def to_dict(self) -> dict[str, Any]:
        summary = {
            "alpha": self.alpha,
            "beta": self.beta,
            "mean_accepted": self.mean_accepted,
            "drafted_share": self.drafted_share,
            "tokens_per_second": self.tokens_per_second,
        }
        return {**asdict(self), **summary}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Stats:
        names = {"iterations", "generated", "accepted", "accepted_ngram", "draft_slots", "tree_nodes", "seconds",
                 "drafted_iterations"}  # fmt: skip
        stats = cls(**{k: v for k, v in data.items() if k in names})
        if "drafted_iterations" not in data and stats.draft_slots:  # drafted, how often unknown
            stats.drafted_iterations = None
        return stats
