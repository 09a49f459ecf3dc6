"""Sizing the draft from measurement: which plan each iteration uses (TokenSwift on a CPU).

On a GPU extra candidate tokens are nearly free; on a CPU each one costs attention arithmetic that
grows with the context, and the draft pass costs about a plain step. What pays off depends on the
machine, the context length and the acceptance of this very text, so the tuner measures it: it
tries each plan (plain steps, small and full drafts, from a draft pass or from the verification
pass) for a few iterations, keeps the one with the most tokens per second, and probes them all
again after `period` iterations, then after twice as many, and so on (up to `max_period`):
costs drift slowly as the context grows, while every probe of a slow plan costs time. A plan that
could not beat the best even if every draft were accepted (a 45-node tree at 8K context takes ~8
plain steps on this CPU and commits at most 5 tokens) is not probed again, nor a large draft whose
small version was measured slower than the best plan. Plain steps
are one of the plans, so the automatic mode is never much slower than plain decoding. Every plan
writes the same text (each is lossless), so switching between them changes only the speed.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

from .config import DraftConfig, RunConfig

LOOKUP_SHORT = 4  # the short lookup's length: probed before the long one, which pays only where it does


@dataclass(frozen=True)
class Plan:
    """How one iteration drafts: `source` "plain" verifies the root alone (a plain decoding step)."""

    source: str  # "plain", "pass", "verify", "ngram" or "lookup"
    draft: DraftConfig

    @property
    def depth_cap(self) -> int:
        """The deepest draft the plan allows (the paper's K + 1 slots of alpha)."""
        if self.source == "plain":
            return 0
        if self.source == "ngram":
            return self.draft.ngram_size - 1 if self.draft.ngram_top_k else 0
        if self.source == "lookup":
            return self.draft.lookup_length or 0
        return max(len(self.draft.tree), self.draft.ngram_size if self.draft.ngram_top_k else 0)

    @property
    def name(self) -> str:
        if self.source == "plain":
            return "plain"
        if self.source == "ngram":
            return f"ngram{self.draft.ngram_top_k or 0}"
        if self.source == "lookup":
            return f"lookup{self.draft.lookup_length or 0}"
        tree = ",".join(map(str, self.draft.tree))
        return f"{self.source}[{tree}]+ngram{self.draft.ngram_top_k or 0}"


def candidate_plans(cfg: RunConfig, *, num_heads: int) -> list[Plan]:
    """The configured plan, or with `auto`: plain steps, n-grams alone, short and long lookups, and small
    and full drafts of both sources (each smaller draft before the larger one of its source)."""
    draft = cfg.draft
    if cfg.mode == "plain":
        return [Plan("plain", draft)]
    if not draft.auto:
        return [Plan(draft.source, draft)]
    full_k = draft.ngram_top_k or 4
    small = dataclasses.replace(draft, tree=(1,) * min(len(draft.tree), 1 + num_heads), ngram_top_k=1)
    full = dataclasses.replace(draft, ngram_top_k=full_k)
    verify_small = dataclasses.replace(draft, tree=(1,) * max(num_heads, 1), ngram_top_k=1)
    verify_full = dataclasses.replace(draft, tree=draft.tree[1:] or (1,), ngram_top_k=full_k)
    ngram_only = dataclasses.replace(draft, ngram_top_k=1)  # the cheapest draft: prompt lookup's
    plans = [Plan("plain", draft), Plan("ngram", ngram_only)]
    if draft.lookup_length is not None:
        short = dataclasses.replace(draft, lookup_length=min(draft.lookup_length, LOOKUP_SHORT))
        plans += [Plan("lookup", short)] + ([Plan("lookup", draft)] if draft.lookup_length > LOOKUP_SHORT else [])
    plans += [Plan("verify", verify_small), Plan("verify", verify_full)]
    return plans + [Plan("pass", small), Plan("pass", full)]


@dataclass
class _Arm:
    plan: Plan
    tokens: float = 0.0
    seconds: float = 0.0
    iterations: float = 0.0
    rest: int = 0  # rounds this plan sits out before its next probe
    backoff: int = 1  # rounds it sits out after its next losing probe

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def ceiling(self) -> float:
        """The rate if every draft slot of every iteration were accepted (unknown before a probe)."""
        return (self.plan.depth_cap + 1) * self.iterations / self.seconds if self.seconds > 0 else math.inf


class Tuner:
    """Chooses the plan of each iteration and learns from the measured tokens and seconds.

    Each round begins with probes: `probe` iterations of every plan (half as many in the first
    round, which short runs cannot afford), one for a plan that ran at under `keep` x the best rate:
    every probe of a slower plan costs time, and most plans stay slower for the whole run. So a plan
    that loses its probe sits out the next round, then two, four, up to `max_rest` rounds (sampled
    prose accepts as little at 50K tokens as at 5K: re-probing every loser each round cost ~5% of a
    512-token case at 8K).
    """

    def __init__(
        self,
        plans: Sequence[Plan],
        *,
        probe: int = 4,
        period: int = 128,
        max_period: int = 1024,
        decay: float = 0.97,
        keep: float = 0.85,
        max_rest: int = 8,
    ) -> None:
        self.arms = [_Arm(p) for p in plans]
        self.probe, self.period, self.max_period, self.decay, self.keep = probe, period, max_period, decay, keep
        self.max_rest = max_rest
        self.iteration = 0  # iterations since the current round of probes began
        self.best = 0
        self.probes = self._schedule()

    @classmethod
    def for_run(cls, cfg: RunConfig, *, num_heads: int) -> Tuner:
        return cls(candidate_plans(cfg, num_heads=num_heads))

    def _schedule(self) -> list[int]:
        """The arms probed at the start of this round, in order, one entry per iteration."""
        best = self.arms[self.best].rate
        schedule: list[int] = []
        for index, arm in enumerate(self.arms):
            if self._skipped(index):
                continue
            if arm.seconds == 0:
                count = max(1, self.probe // 2)
            elif arm.rate >= self.keep * best:
                count, arm.backoff = self.probe, 1
            elif arm.rest > 0:
                arm.rest -= 1
                continue
            else:  # a loser: one probe, then a longer rest
                count, arm.rest, arm.backoff = 1, arm.backoff, min(2 * arm.backoff, self.max_rest)
            schedule += [index] * count
        return schedule

    def next(self) -> Plan:
        """The plan of this iteration: a probe at the start of each round, else the fastest so far."""
        if len(self.arms) == 1:
            return self.arms[0].plan
        if self.iteration >= self.period:  # a new round: probe again, and wait longer next time
            self.iteration, self.period = 0, min(2 * self.period, self.max_period)
            self.probes = self._schedule()
        if self.iteration < len(self.probes) and not self._skipped(self.probes[self.iteration]):
            return self.arms[self.probes[self.iteration]].plan
        return self.arms[self.best].plan

    def _skipped(self, index: int) -> bool:
        return self._hopeless(index) or self._outgrown(index)

    def _hopeless(self, index: int) -> bool:
        """Whether arm `index` cannot beat the best plan's measured rate even at full acceptance."""
        return self.arms[index].ceiling < self.arms[self.best].rate

    def _outgrown(self, index: int) -> bool:
        """Whether a smaller draft of the same source (an earlier arm) was measured slower than the best.

        A larger tree costs several plain steps on a CPU; when the small draft of its source does not
        pay, the text accepts too little for the large one, and probing it would cost most of a short run.
        """
        source, best = self.arms[index].plan.source, self.arms[self.best].rate
        return any(a.plan.source == source and a.seconds > 0 and a.rate < best for a in self.arms[:index])

    def record(self, plan: Plan, tokens: int, seconds: float) -> None:
        """One iteration of `plan` committed `tokens` in `seconds` (older measurements fade)."""
        self.iteration += 1
        if len(self.arms) == 1:
            return
        arm = next(a for a in self.arms if a.plan == plan)
        arm.tokens = arm.tokens * self.decay + tokens
        arm.seconds = arm.seconds * self.decay + seconds
        arm.iterations = arm.iterations * self.decay + 1
        self.best = max(range(len(self.arms)), key=lambda i: self.arms[i].rate)

    def summary(self) -> dict[str, float]:
        """Measured tokens/s of each plan."""
        return {a.plan.name: a.rate for a in self.arms}


class Tuners:
    """One tuner per kind of iteration: while the text repeats a stretch of itself (`lookup.Match`),
    a long lookup may commit a dozen tokens per step where nothing else pays, and measurements made
    on fresh prose would hide that for hundreds of iterations. While it repeats, only plain steps and
    lookups are tried: heads and n-grams predict a loop no better than the lookup, and each probe of
    a large tree costs several plain steps (at 8K of context, probing them cost a fifth of 256 tokens)."""

    def __init__(self, plans: Sequence[Plan], **options: float) -> None:
        self._plans, self._options = list(plans), options
        self._tuners: dict[bool, Tuner] = {}

    @classmethod
    def for_run(cls, cfg: RunConfig, *, num_heads: int) -> Tuners:
        return cls(candidate_plans(cfg, num_heads=num_heads))

    def __getitem__(self, repeating: bool) -> Tuner:
        if repeating not in self._tuners:
            plans = [p for p in self._plans if p.source in ("plain", "lookup")] if repeating else []
            self._tuners[repeating] = Tuner(plans or self._plans, **self._options)  # type: ignore[arg-type]
        return self._tuners[repeating]
