"""The Medusa-style draft source and the automatic mode are lossless; the tuner keeps the fastest plan."""

from __future__ import annotations

import pytest
from helpers import first_divergence, random_heads, random_prompt, tiny_target

from tokenswift_cli.config import DraftConfig, RunConfig, SamplingConfig
from tokenswift_cli.engine.auto.tuner import Costs, Plan, Tuner, candidate_plans
from tokenswift_cli.engine.decode import generate_tokens
from tokenswift_cli.engine.drafters.draft_pass import PassDrafter
from tokenswift_cli.engine.drafters.from_verify import VerifyDrafter
from tokenswift_cli.engine.drafters.lookup import LookupDrafter
from tokenswift_cli.engine.drafters.plain import PlainDrafter

SMALL = {"partial_budget": 64, "sink_tokens": 4, "recent_window": 16}
SAMPLED = SamplingConfig(temperature=1.0, min_p=0.1, penalty=1.2, penalty_window=64, seed=5)


@pytest.mark.parametrize("sampling", [SamplingConfig(), SAMPLED], ids=["greedy", "sampled"])
@pytest.mark.parametrize(
    "draft",
    [
        DraftConfig(source="verify", **SMALL),
        DraftConfig(source="verify", tree=(2, 2), ngram_top_k=None),
        DraftConfig(auto=True, **SMALL),
        DraftConfig(source="lookup", lookup_length=12),
    ],  # fmt: skip
    ids=["verify", "verify-heads-only", "auto", "lookup"],
)
def test_new_variants_match_plain(sampling: SamplingConfig, draft: DraftConfig) -> None:
    target = tiny_target("llama-gqa", seed=3)
    prompt = random_prompt(90, seed=4)
    plain, _ = generate_tokens(target, None, prompt, RunConfig(max_new_tokens=160, mode="plain", sampling=sampling))
    for heads in (random_heads(target), None):
        cfg = RunConfig(max_new_tokens=160, sampling=sampling, draft=draft)
        fast, stats = generate_tokens(target, heads, prompt, cfg)
        assert first_divergence(fast, plain) is None
        assert stats.generated == 160


@pytest.mark.parametrize("source", ["verify", "ngram", "lookup"])
def test_root_keyed_ngram_drafts_are_accepted_on_repetitive_text(source: str) -> None:
    target = tiny_target("qwen2", seed=1)
    prompt = random_prompt(12, seed=2) * 6  # the table has seen every continuation
    cfg = RunConfig(max_new_tokens=120, draft=DraftConfig(source=source, **SMALL))  # type: ignore[arg-type]
    fast, stats = generate_tokens(target, None, prompt, cfg)
    plain, _ = generate_tokens(target, None, prompt, RunConfig(max_new_tokens=120, mode="plain"))
    assert fast == plain
    assert stats.accepted_ngram > 0


def test_plans_of_auto_mode() -> None:
    cfg = RunConfig(max_new_tokens=10, draft=DraftConfig(auto=True))
    plans = candidate_plans(cfg, num_heads=3)
    sources = ["plain", "ngram", "lookup", "lookup", "verify", "verify", "pass", "pass", "pass"]
    assert [p.source for p in plans] == sources
    assert [p.draft.tree for p in plans[-3:]] == [(1, 1, 1, 1), (1, 3, 3, 3), (3, 3, 3, 3)]  # small, full, wide
    assert [p.depth_cap for p in plans[2:4]] == [4, 16]  # the short lookup first
    assert plans[0].depth_cap == 0 and all(p.depth_cap > 0 for p in plans[1:])
    no_lookup = RunConfig(max_new_tokens=10, draft=DraftConfig(auto=True, lookup_length=None))
    assert "lookup" not in [p.source for p in candidate_plans(no_lookup, num_heads=3)]
    assert candidate_plans(RunConfig(max_new_tokens=10), num_heads=3) == [Plan(PassDrafter, DraftConfig())]
    assert [p.source for p in candidate_plans(RunConfig(max_new_tokens=10, mode="plain"), num_heads=3)] == ["plain"]


PLAIN = Plan(PlainDrafter, DraftConfig())
SMALL_TREE = Plan(VerifyDrafter, DraftConfig(source="verify", tree=(1,), ngram_top_k=1))
LARGE_TREE = Plan(VerifyDrafter, DraftConfig(source="verify", tree=(3, 3, 3)))
PASS = Plan(PassDrafter, DraftConfig())
LOOKUP = Plan(LookupDrafter, DraftConfig(source="lookup", lookup_length=16))


def _run(
    tuner: Tuner, iterations: int, accepted: dict[Plan, int], rows: dict[Plan, int], steps: dict[Plan, float]
) -> list[Plan]:
    """Drive `tuner`: every plan's shadow accepts `accepted[plan]` of `rows[plan]` rows, and an iteration
    of a plan takes `steps[plan]` plain steps (a plain step: 10 ms); returns the plans run."""
    chosen = []
    for _ in range(iterations):
        for plan in tuner.shadowed():
            tuner.observe(plan, accepted[plan], rows[plan])
        plan = tuner.next()
        chosen.append(plan)
        tuner.record(plan, accepted.get(plan, 0) + 1, 0.01 * steps.get(plan, 1.0), rows=rows.get(plan, 1))
    return chosen


def test_tuner_runs_plain_steps_while_no_shadow_accepts_anything() -> None:
    plans = candidate_plans(RunConfig(max_new_tokens=10, draft=DraftConfig(auto=True)), num_heads=3)
    tuner = Tuner(plans)
    nothing = dict.fromkeys(plans, 0)
    chosen = _run(tuner, 300, nothing, dict.fromkeys(plans, 5), {})
    assert {p.source for p in chosen} == {"plain"}  # sampled prose: no plan is ever run to find out it does not pay
    assert tuner.summary()["plain"] == 1.0


def test_tuner_prices_rows_with_the_smallest_paying_plan_then_keeps_the_fastest() -> None:
    tuner = Tuner([PLAIN, SMALL_TREE, LARGE_TREE])
    accepted, rows = {SMALL_TREE: 2, LARGE_TREE: 3}, {SMALL_TREE: 4, LARGE_TREE: 41}
    steps = {SMALL_TREE: 2.0, LARGE_TREE: 21.0}  # a row costs a third of a plain step
    chosen = _run(tuner, 50, accepted, rows, steps)
    # Before any tree ran both looked free; the small one ran first, and its cost priced the large
    # one at 1 + 40 / 3 plain steps for 4 tokens: never worth a try.
    assert chosen[0] == PLAIN and set(chosen[1:]) == {SMALL_TREE}
    assert tuner.costs.row == pytest.approx(1 / 3)
    # Greedy text on a GPU: rows nearly free, the large tree accepts more and wins once priced.
    tuner = Tuner([PLAIN, SMALL_TREE, LARGE_TREE])
    chosen = _run(tuner, 50, {SMALL_TREE: 2, LARGE_TREE: 6}, rows, {SMALL_TREE: 1.1, LARGE_TREE: 2.2})
    assert chosen[1] == SMALL_TREE and chosen[-1] == LARGE_TREE


def test_tuner_leaves_a_plan_whose_measured_cost_outweighs_its_acceptance() -> None:
    tuner = Tuner([PLAIN, LOOKUP])
    chosen = _run(tuner, 100, {LOOKUP: 1}, {LOOKUP: 17}, {LOOKUP: 5.0})  # 2 tokens in 5 plain steps' time
    assert chosen.count(LOOKUP) == 1 and chosen[-1] == PLAIN


def test_costs_learn_a_price_per_row_and_for_the_draft_pass() -> None:
    costs = Costs()
    assert costs.record(PLAIN, 1, 0.010) == pytest.approx(1.0)
    assert costs.row is None and costs.estimate(PASS, 41) == pytest.approx(2.0)  # rows free, the draft 1 step
    costs.record(LOOKUP, 9, 0.050)  # 5 plain steps for 8 extra rows
    assert costs.row == pytest.approx(0.5)
    assert costs.estimate(LOOKUP, 17) == pytest.approx(9.0)
    costs.record(PASS, 5, 0.050)  # 5 steps: 3 for its rows, so 2 for the draft pass
    assert costs.draft.get(0.0) == pytest.approx(2.0)


def test_tuner_learns_acceptance_from_the_steps_a_plan_runs_too() -> None:
    tuner = Tuner([PLAIN, LOOKUP])
    tuner.record(PLAIN, 1, 0.01)
    tuner.observe(LOOKUP, 8, 17)  # one lucky shadow
    chosen = []
    for _ in range(20):  # then no shadow for a while; the lookup runs and accepts nothing
        plan = tuner.next()
        chosen.append(plan)
        tuner.record(plan, 1, 0.02 if plan == LOOKUP else 0.01, rows=17 if plan == LOOKUP else 1)
    assert chosen[0] == LOOKUP and chosen[-1] == PLAIN and chosen.count(LOOKUP) <= 8  # not all 20
