"""The target's scores, and the token, of one row of logits in one C++ call on a CPU (csrc/scores.cpp).

`distribution.scored` is the definition: the rules one torch op at a time, each over a copy of the
vocabulary's row (~3 ms a token with the defaults, most of it the ops' overhead). The kernel applies
the same rules in the same float32 operations in a few passes (suppressed ids, the filters' masks,
DRY, the penalty, temperature, top-k, min-p), then argmax or `_draw_kept`'s search, so its scores
are the same bits and its tokens the same tokens (tests/test_sampling_fused.py). Where a sum's
rounding would decide (a score at min-p's cut), it hands back, and `distribution` finishes with its
torch code: so do the rules it lacks (top-p, eta, XTC), NaN or +inf scores, and a machine without a
compiler (`kernels.available()`).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import MinPLogitsWarper, RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper, TopKLogitsWarper

from tokenswift_cli.config import SamplingConfig

SCORES, ARGMAX, DRAW = 0, 1, 2  # what the kernel returns besides the scores: nothing, the argmax, the draw
UNDRAWN, MIN_P_UNSETTLED, UNHANDLED = -1, -2, -3  # its codes (csrc/scores.cpp)
FUSED = "TOKENSWIFT_FUSED_SCORES"  # "0": the torch definition everywhere (for comparisons)


@dataclass(frozen=True)
class Plan:
    """What the kernel applies for one `SamplingConfig`: a prefix of its processors (`distribution._processors`)."""

    window: int  # the penalty's window (0: no penalty)
    penalty: float
    temperature: float  # 0: none
    top_k: int  # 0: none
    min_p: float  # 0: none
    min_p_at: int  # min-p's index among the processors (where torch resumes when the kernel hands it back)
    rest_at: int  # the processors from here on are torch's (top-p, eta and what follows them)
    processors: int
    suppress: torch.Tensor
    dry_table: torch.Tensor  # [65] float32, empty without DRY
    dry_range: int
    dry_allowed: int

    @property
    def complete(self) -> bool:
        return self.rest_at == self.processors


def plan(cfg: SamplingConfig, processors: Sequence[Any], dry_table: torch.Tensor | None) -> Plan:
    """The kernel's share of `processors` (in `transformers`' order: penalty, temperature, top-k, ...)."""
    fields: dict[str, Any] = {"window": 0, "penalty": 1.0, "temperature": 0.0, "top_k": 0, "min_p": 0.0}
    order = (RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper, TopKLogitsWarper, MinPLogitsWarper)
    rest_at, min_p_at, stage = len(processors), len(processors), 0
    for index, processor in enumerate(processors):
        kind = type(processor)
        if kind not in order[stage:]:
            rest_at = index
            break
        stage = order.index(kind) + 1
        if kind is RepetitionPenaltyLogitsProcessor:
            fields.update(window=cfg.penalty_window, penalty=float(processor.penalty))
        elif kind is TemperatureLogitsWarper:
            fields["temperature"] = float(processor.temperature)
        elif kind is TopKLogitsWarper:
            fields["top_k"] = int(processor.top_k)
        else:
            fields["min_p"], min_p_at = float(processor.min_p), index
    return Plan(
        **fields, min_p_at=min_p_at, rest_at=rest_at, processors=len(processors),
        suppress=torch.tensor(cfg.suppress_token_ids, dtype=torch.long),
        dry_table=torch.zeros(0) if dry_table is None else dry_table.float().contiguous(),
        dry_range=cfg.dry_range, dry_allowed=cfg.dry_allowed_length,
    )  # fmt: skip


def usable(logits: torch.Tensor, context: torch.Tensor) -> bool:
    """Whether the kernel scores this row: float32 logits `[vocab]` and a context on the CPU, kernels built."""
    on_cpu = logits.device.type == "cpu" and context.device.type == "cpu"
    if not on_cpu or logits.dtype != torch.float32 or logits.dim() != 1 or os.environ.get(FUSED) == "0":
        return False
    return built()


@functools.cache
def built() -> bool:
    """Whether the kernels are built, asked once: a failed build is not cached by `kernels.load`, and
    would be tried again at every token."""
    from tokenswift_cli.backends.cpu import kernels  # the C++ kernels live beside the decoder's

    return kernels.available()


def run(
    plan: Plan, logits: torch.Tensor, context: torch.Tensor, banned: Sequence[torch.Tensor], mode: int, u: float,
    searched: int, out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, int] | None:  # fmt: skip
    """(scores, the token or a code) of `logits` after `context`, `banned` the filters' masks; None where the
    kernel cannot (a NaN or +inf score, a mask of another size): the torch definition then runs."""
    from tokenswift_cli.backends.cpu import kernels

    vocab = logits.shape[0]
    if any(mask.shape != (vocab,) or mask.dtype != torch.bool for mask in banned):
        return None
    scores = torch.empty(vocab, dtype=torch.float32) if out is None else out
    code = kernels.load().target_draw(
        logits.contiguous(), scores, context.long().contiguous(), plan.suppress,
        [mask.contiguous() for mask in banned], plan.dry_table, plan.dry_range, plan.dry_allowed, plan.window,
        plan.penalty, plan.temperature, plan.top_k, plan.min_p, mode, u, searched,
    )  # fmt: skip
    return None if code == UNHANDLED else (scores, code)


_buffers: dict[int, torch.Tensor] = {}


def buffer(vocab: int) -> torch.Tensor:
    """A float32 `[vocab]` kept for scores that do not leave the call (a draw's): no allocation per token."""
    if vocab not in _buffers:
        _buffers[vocab] = torch.empty(vocab, dtype=torch.float32)
    return _buffers[vocab]
