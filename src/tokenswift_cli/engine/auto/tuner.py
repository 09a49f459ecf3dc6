"""Sizing the draft from measurement: which plan each iteration uses (TokenSwift on a CPU).

On a GPU extra candidate tokens are nearly free; on a CPU each one costs attention arithmetic that
grows with the context, and the draft pass costs about a plain step. What pays off depends on the
machine, the context length and the acceptance of this very text, so the tuner measures both apart:

* acceptance without verifying (shadow.py): what each plan's draft would have accepted is the
  longest of its paths that the committed text continues, known a few tokens later at no forward's
  cost. Every plan is scored so, all the time, whichever plan runs;
* cost from the iterations that run: plain steps give the unit, and every iteration with a tree of
  R rows a cost per extra row, so a plan that never ran still has a price (`Costs`).

Each iteration takes the plan with the most expected tokens per plain step's time. A plan runs only
when its measured acceptance pays for its estimated cost, so sampled prose, which accepts almost
nothing, runs plain steps without first paying to find that out. Every plan writes the same text
(each is lossless), so switching between them changes only the speed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from tokenswift_cli.config import DraftConfig, RunConfig
from tokenswift_cli.engine.drafters.base import DraftModel, SourceDrafter
from tokenswift_cli.engine.drafters.draft_pass import PassDrafter
from tokenswift_cli.engine.drafters.from_verify import VerifyDrafter
from tokenswift_cli.engine.drafters.lookup import LookupDrafter
from tokenswift_cli.engine.drafters.ngrams import NGramDrafter
from tokenswift_cli.engine.drafters.plain import PlainDrafter
from tokenswift_cli.engine.drafters.sources import SOURCES

LOOKUP_SHORT = 4  # the short lookup's length: cheap where the long one's tail is rejected
WIDE_ROOTS = 3  # the wide draft's level 1: the base model's top 3 (more tokens a step, at three times the rows)


@dataclass(frozen=True)
class Plan:
    """How one iteration drafts: a source (the plain drafter verifies the root alone) and its settings."""

    drafter: type[SourceDrafter]
    draft: DraftConfig

    @property
    def source(self) -> str:
        """The source's name, as `--draft` spells it."""
        return self.drafter.name

    @property
    def plain(self) -> bool:
        """A plain decoding step: the unit of every cost, the rate to beat."""
        return self.drafter is PlainDrafter

    @property
    def depth_cap(self) -> int:
        """The deepest draft the plan allows (the paper's K + 1 slots of alpha)."""
        return self.drafter.slots(self.draft)

    @property
    def name(self) -> str:
        return self.drafter.label(self.draft)

    def build(self, model: DraftModel) -> SourceDrafter:
        """The plan's drafter, drafting with `model`."""
        return self.drafter(self.draft, model)


def candidate_plans(cfg: RunConfig, *, num_heads: int) -> list[Plan]:
    """The configured plan, or with `auto`: plain steps, n-grams alone, short and long lookups, small and
    full drafts of both sources, and a draft pass whose level 1 is the base model's top 3 (each smaller
    draft before the larger one of its source)."""
    draft = cfg.draft
    if cfg.mode == "plain":
        return [Plan(PlainDrafter, draft)]
    if not draft.auto:
        return [Plan(SOURCES[draft.source], draft)]
    full_k = draft.ngram_top_k or 4
    small = dataclasses.replace(draft, tree=(1,) * min(len(draft.tree), 1 + num_heads), ngram_top_k=1)
    full = dataclasses.replace(draft, ngram_top_k=full_k)
    verify_small = dataclasses.replace(draft, tree=(1,) * max(num_heads, 1), ngram_top_k=1)
    verify_full = dataclasses.replace(draft, tree=draft.tree[1:] or (1,), ngram_top_k=full_k)
    ngram_only = dataclasses.replace(draft, ngram_top_k=1)  # the cheapest draft: prompt lookup's
    plans = [Plan(PlainDrafter, draft), Plan(NGramDrafter, ngram_only)]
    if draft.lookup_length is not None:
        short = dataclasses.replace(draft, lookup_length=min(draft.lookup_length, LOOKUP_SHORT))
        longer = [Plan(LookupDrafter, draft)] if draft.lookup_length > LOOKUP_SHORT else []
        plans += [Plan(LookupDrafter, short), *longer]
    plans += [Plan(VerifyDrafter, verify_small), Plan(VerifyDrafter, verify_full)]
    plans += [Plan(PassDrafter, small), Plan(PassDrafter, full)]
    if draft.tree[0] < WIDE_ROOTS:
        plans.append(Plan(PassDrafter, dataclasses.replace(full, tree=(WIDE_ROOTS, *draft.tree[1:]))))
    return plans


class _Mean:
    """A mean over recent observations: each new one weighs 1, older ones fade by `decay` per observation."""

    def __init__(self, decay: float) -> None:
        self.decay, self.total, self.weight = decay, 0.0, 0.0

    def add(self, value: float) -> None:
        self.total = self.total * self.decay + value
        self.weight = self.weight * self.decay + 1.0

    def get(self, default: float) -> float:
        return self.total / self.weight if self.weight > 0 else default


class Costs:
    """Seconds of an iteration, in plain steps: `1 + row * (rows - 1)`, plus `draft` for a draft pass.

    Plain steps measure the unit (it grows with the context); any tree measures `row`, the ratio of
    summed extra cost to summed extra rows, which a large tree weighs most. Until some tree has run,
    `row` is unknown (None).
    """

    def __init__(self, decay: float = 0.95) -> None:
        self.plain = _Mean(decay)  # seconds of a one-row iteration without a draft pass
        self._extra, self._rows = _Mean(decay), _Mean(decay)  # extra plain steps and extra rows of trees
        self.draft = _Mean(decay)  # a draft pass, in plain steps

    @property
    def row(self) -> float | None:
        return self._extra.total / self._rows.total if self._rows.weight > 0 else None

    def record(self, plan: Plan, rows: int, seconds: float) -> float | None:
        """Learn from one iteration; returns its cost in plain steps (None before any plain step)."""
        if rows == 1 and not plan.drafter.draft_pass:
            self.plain.add(seconds)
        unit = self.plain.get(0.0)
        if unit <= 0:
            return None
        steps = seconds / unit
        if plan.drafter.draft_pass:
            self.draft.add(max(0.0, steps - self.estimate(plan, rows, with_draft=False)))
        elif rows > 1:
            self._extra.add(steps - 1.0)
            self._rows.add(rows - 1.0)
        return steps

    def estimate(self, plan: Plan, rows: float, *, with_draft: bool = True) -> float:
        """Plain steps an iteration of `plan` with `rows` rows should take (extra rows free while unmeasured)."""
        steps = 1.0 + (self.row or 0.0) * max(0.0, rows - 1.0)
        return steps + (self.draft.get(1.0) if with_draft and plan.drafter.draft_pass else 0.0)


@dataclass
class _Arm:
    plan: Plan
    accepted: _Mean  # draft tokens the plan's shadows would have accepted per iteration
    rows: _Mean  # rows of the plan's trees
    steps: _Mean  # measured cost of its own iterations, in plain steps

    def expected_rate(self, costs: Costs) -> float:
        """Tokens per plain step's time: accepted + 1 over the cost (measured, blended with the estimate)."""
        if self.plan.plain:
            return 1.0
        estimate = costs.estimate(self.plan, self.rows.get(1.0))
        cost = (self.steps.total + estimate) / (self.steps.weight + 1.0)
        return (1.0 + self.accepted.get(0.0)) / cost


class Tuner:
    """Chooses the plan of each iteration from shadow acceptance and measured costs.

    A plan must promise `gain` x a plain step's rate to replace plain steps. While no tree has run,
    extra rows count as free: then only the smallest plan that would pay runs, whose cost prices
    the others.
    """

    def __init__(
        self,
        plans: Sequence[Plan],
        *,
        costs: Costs | None = None,
        decay: float = 0.97,
        gain: float = 1.05,
    ) -> None:
        self.arms = [_Arm(p, _Mean(decay), _Mean(decay), _Mean(decay)) for p in plans]
        self.costs = costs if costs is not None else Costs()
        self.gain = gain

    def next(self) -> Plan:
        """The plan of this iteration: the highest expected rate, plain steps unless another beats them by `gain`."""
        if len(self.arms) == 1:
            return self.arms[0].plan
        rates = [a.expected_rate(self.costs) for a in self.arms]
        paying = [i for i, r in enumerate(rates) if r >= self.gain and not self.arms[i].plan.plain]
        plain = next((a.plan for a in self.arms if a.plan.plain), self.arms[0].plan)
        if not paying or self.costs.plain.weight == 0:  # a plain step first: the unit of every cost
            return plain
        if self.costs.row is None:  # rows unpriced: try the smallest paying tree first
            return self.arms[min(paying, key=lambda i: (self.arms[i].rows.get(1.0), -rates[i]))].plan
        return self.arms[max(paying, key=lambda i: rates[i])].plan

    def shadowed(self) -> list[Plan]:
        """The plans whose acceptance shadows measure: all but plain steps (none when there is no choice)."""
        return [a.plan for a in self.arms if not a.plan.plain] if len(self.arms) > 1 else []

    def observe(self, plan: Plan, accepted: int, rows: int) -> None:
        """A shadow of `plan` (a tree of `rows` rows) would have accepted `accepted` draft tokens."""
        arm = self._arm(plan)
        arm.accepted.add(accepted)
        arm.rows.add(rows)

    def record(self, plan: Plan, tokens: int, seconds: float, rows: int = 1) -> None:
        """One iteration of `plan`, a tree of `rows` rows, committed `tokens` in `seconds`.

        Its acceptance counts as a shadow's: shadows are drafted only now and then, and a plan that
        runs on a few lucky shadows must learn from its own steps that the luck ran out.
        """
        steps = self.costs.record(plan, rows, seconds)
        if len(self.arms) == 1 or plan.plain:
            return
        self.observe(plan, tokens - 1, rows)
        if steps is not None:
            self._arm(plan).steps.add(steps)

    def _arm(self, plan: Plan) -> _Arm:
        return next(a for a in self.arms if a.plan == plan)

    def summary(self) -> dict[str, float]:
        """Expected tokens per plain step's time of each plan."""
        return {a.plan.name: a.expected_rate(self.costs) for a in self.arms}


class Tuners:
    """One tuner per kind of iteration: while the text repeats a stretch of itself (`lookup.Match`),
    a long lookup may commit a dozen tokens per step where nothing else pays, and acceptance measured
    on fresh prose would hide that for hundreds of iterations. While it repeats, only plain steps and
    lookups are tried: heads and n-grams predict a loop no better than the lookup. Both share the
    costs, which do not depend on the text."""

    def __init__(self, plans: Sequence[Plan], **options: float) -> None:
        self._plans, self._options = list(plans), options
        self._costs = Costs()
        self._tuners: dict[bool, Tuner] = {}

    def __getitem__(self, repeating: bool) -> Tuner:
        if repeating not in self._tuners:
            plans = [p for p in self._plans if p.drafter in (PlainDrafter, LookupDrafter)] if repeating else []
            self._tuners[repeating] = Tuner(plans or self._plans, costs=self._costs, **self._options)  # type: ignore[arg-type]
        return self._tuners[repeating]
