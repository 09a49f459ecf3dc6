"""The Medusa-style draft source and the automatic mode are lossless; the tuner keeps the fastest plan."""

from __future__ import annotations

import pytest
from helpers import first_divergence, random_heads, random_prompt, tiny_target

from tokenswift_cli.autotune import Plan, Tuner, candidate_plans
from tokenswift_cli.config import DraftConfig, RunConfig, SamplingConfig
from tokenswift_cli.decode import generate_tokens

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
    assert [p.source for p in plans] == ["plain", "ngram", "lookup", "lookup", "verify", "verify", "pass", "pass"]
    assert [p.depth_cap for p in plans[2:4]] == [4, 16]  # the short lookup first
    assert plans[0].depth_cap == 0 and all(p.depth_cap > 0 for p in plans[1:])
    no_lookup = RunConfig(max_new_tokens=10, draft=DraftConfig(auto=True, lookup_length=None))
    assert "lookup" not in [p.source for p in candidate_plans(no_lookup, num_heads=3)]
    assert candidate_plans(RunConfig(max_new_tokens=10), num_heads=3) == [Plan("pass", DraftConfig())]
    assert [p.source for p in candidate_plans(RunConfig(max_new_tokens=10, mode="plain"), num_heads=3)] == ["plain"]


def _drive(tuner: Tuner, iterations: int, rates: dict[str, float], tokens: dict[str, int]) -> list[str]:
    """Run `tuner` for `iterations`: each plan commits `tokens[source]` per iteration at `rates[source]` tokens/s."""
    chosen = []
    for _ in range(iterations):
        plan = tuner.next()
        chosen.append(plan.source)
        tuner.record(plan, tokens[plan.source], tokens[plan.source] / rates[plan.source])
    return chosen


def test_tuner_probes_every_plan_then_keeps_the_fastest() -> None:
    plans = [Plan("plain", DraftConfig()), Plan("verify", DraftConfig(source="verify")), Plan("pass", DraftConfig())]
    rates = {"plain": 10.0, "verify": 30.0, "pass": 20.0}  # tokens per second of each plan
    tuner = Tuner(plans, probe=2, period=50)
    chosen = _drive(tuner, 1500, rates, {"plain": 1, "verify": 3, "pass": 3})
    assert chosen[:3] == ["plain", "verify", "pass"]  # the first round probes each plan briefly
    assert set(chosen[3:50]) == {"verify"}
    # Later rounds probe again as the context grows, then less often; a plan clearly slower than the
    # best (under `keep` x its rate) gets a single probe, then sits out the next round, and plain
    # steps, whose 1 token per step is all they can do, none while a draft plan is faster.
    assert chosen[50:53] == ["verify", "verify", "pass"]
    assert chosen[150:152] == ["verify", "verify"] and set(chosen[53:350]) == {"verify"}
    assert chosen[350:353] == ["verify", "verify", "pass"]  # then two rounds out, four, ...
    assert "pass" not in chosen[353:]
    assert tuner.summary()["plain"] == pytest.approx(10.0)


def test_tuner_drops_a_plan_that_could_not_win_even_at_full_acceptance() -> None:
    costly = Plan("pass", DraftConfig(tree=(1, 3, 3, 3)))  # at most 5 tokens per iteration
    tuner = Tuner([Plan("plain", DraftConfig()), costly], probe=4, period=20)
    # Each iteration of the tree takes 8 plain steps: 5 / 8 of plain's rate even if all were accepted.
    chosen = _drive(tuner, 200, {"plain": 10.0, "pass": 1.0 / 0.8}, {"plain": 1, "pass": 1})
    assert chosen.count("pass") == 1  # one probe, where the first round had two, and none later
    assert chosen[:4] == ["plain", "plain", "pass", "plain"]


def test_tuner_skips_a_large_draft_when_the_small_one_of_its_source_does_not_pay() -> None:
    small = Plan("verify", DraftConfig(source="verify", tree=(1,), ngram_top_k=1))
    large = Plan("verify", DraftConfig(source="verify", tree=(3, 3, 3)))
    plans = [Plan("plain", DraftConfig()), small, large]
    # Sampled text: the small draft accepts little and runs below plain steps; the large one is never tried.
    cost = {"plain": 1.0, "verify": 1.4}
    tuner = Tuner(plans, probe=4, period=20)
    chosen = []
    for _ in range(100):
        plan = tuner.next()
        chosen.append(plan)
        tuner.record(plan, 1, cost[plan.source])
    assert large not in chosen and chosen.count(small) >= 2
    # Greedy text: the small draft beats plain steps, so the large one is probed, and wins.
    tuner = Tuner(plans, probe=4, period=20)
    chosen = []
    for _ in range(40):
        plan = tuner.next()
        chosen.append(plan)
        tuner.record(
            plan, 4 if plan == large else 2 if plan == small else 1, 1.5 if plan == large else cost[plan.source]
        )
    assert chosen[:6] == [plans[0], plans[0], small, small, large, large] and chosen[-1] == large
