"""`--draft auto`: one drafter that, each iteration, runs the plan the tuner expects to write fastest.

It owns the tuners (one for prose, one while the text repeats itself), the plans' drafters, the
shadows that score every plan's drafts on the text that follows, and the cost model. An iteration
is timed from its proposal to the end of its commit; every plan is lossless, so the choice changes
only the speed.
"""

from __future__ import annotations

import time

from tokenswift_cli.config import RunConfig
from tokenswift_cli.engine.auto.shadow import Shadows
from tokenswift_cli.engine.auto.tuner import Plan, Tuner, Tuners, candidate_plans
from tokenswift_cli.engine.drafters.base import DraftModel, Drafts, Step
from tokenswift_cli.engine.state import GenerationState


class AutoDrafter:
    """A composite drafter: its members are the candidate plans' drafters (tuner.candidate_plans)."""

    def __init__(self, cfg: RunConfig, model: DraftModel) -> None:
        plans = candidate_plans(cfg, num_heads=model.heads.num_heads if model.heads is not None else 0)
        self._model, self._members = model, {plan: plan.build(model) for plan in plans}
        self._tuners = Tuners(plans)
        self._shadows = Shadows()  # the other plans' drafts, scored as the text goes on (their acceptance)
        self._tuner: Tuner | None = None  # this iteration's: its plan, when it began, what it verified
        self._plan: Plan | None = None
        self._began = 0.0
        self._step: Step | None = None

    def propose(self, state: GenerationState) -> Drafts | None:
        """The drafts of the plan the tuner picks for this text (prose, or a repeat of itself)."""
        self._began = time.perf_counter()
        match = state.lookup.match(state.tokens, state.root)  # where the text's end occurred before
        self._tuner = self._tuners[match.repeating]
        self._plan = self._tuner.next()
        return self._members[self._plan].propose(state)

    def update(self, state: GenerationState, step: Step) -> None:
        """Every member learns from the iteration (whichever may run next); the shadows draft."""
        assert self._tuner is not None
        for member in self._members.values():
            member.update(state, step)
        self._shadows.draft(self._tuner, self._members, state, step, model=self._model)
        self._step = step

    def committed(self, state: GenerationState) -> None:
        """Score the shadows on the committed text; the tuner records the iteration's tokens and time."""
        assert self._tuner is not None and self._plan is not None and self._step is not None
        self._shadows.follow(state.tokens, state.root)
        tokens, rows = len(self._step.accepted.tokens) + 1, self._step.tree.size
        self._tuner.record(self._plan, tokens, time.perf_counter() - self._began, rows=rows)

    @property
    def depth_cap(self) -> int:
        assert self._plan is not None
        return self._plan.depth_cap
