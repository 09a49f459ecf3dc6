"""Prompt lookup: the draft is what followed the latest longest earlier match, round the loop again."""

from __future__ import annotations

import random

import pytest
from helpers import first_divergence, random_prompt, tiny_target

from tokenswift_cli.config import DraftConfig, RunConfig, SamplingConfig
from tokenswift_cli.engine.auto.tuner import Plan, Tuners, candidate_plans
from tokenswift_cli.engine.decode import generate_tokens
from tokenswift_cli.engine.drafters.draft_pass import PassDrafter
from tokenswift_cli.engine.drafters.lookup import LookupDrafter
from tokenswift_cli.engine.drafters.plain import PlainDrafter
from tokenswift_cli.engine.lookup import REPEATING, TextLookup


def test_a_loop_is_followed_round_as_often_as_the_draft_is_long() -> None:
    match = TextLookup().match([1, 2, 3, 4, 5, 1, 2, 3], root=4)
    assert (match.period, match.length) == (5, 3)
    assert match.draft(10) == (5, 1, 2, 3, 4, 5, 1, 2, 3, 4)
    assert TextLookup().match([7, 7, 7], root=7).draft(4) == (7, 7, 7, 7)  # period 1


def test_the_longest_match_wins_then_the_latest() -> None:
    # the text ends 8, 7, 5, 2 + root 1: "5, 2, 1" occurs after 7 (4 tokens match) and after 9 (3 match)
    assert TextLookup().match([7, 5, 2, 1, 4, 9, 5, 2, 1, 6, 8, 7, 5, 2], root=1).draft(3) == (4, 9, 5)
    # equally long: the latest
    assert TextLookup().match([5, 2, 1, 4, 5, 2, 1, 6, 3, 5, 2], root=1).draft(3) == (6, 3, 5)


def test_fewer_than_three_matching_tokens_draft_nothing() -> None:
    assert TextLookup().match([1, 2, 3], root=9).draft(5) == ()
    match = TextLookup().match([4, 1, 2, 5, 1], root=2)  # "1, 2" occurred, "5, 1, 2" did not
    assert match.draft(5) == () and not match.repeating


def test_a_long_period_drafts_only_what_followed() -> None:
    match = TextLookup(max_draft=4).match([1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2], root=3)
    assert match.period == 9 and match.draft(16) == (4, 5, 6, 7)  # the period is longer than what was kept


def test_repeating_needs_a_long_match() -> None:
    text = list(range(100, 100 + REPEATING + 2))
    assert TextLookup().match(text + text[:REPEATING], root=text[REPEATING]).repeating
    assert not TextLookup().match(text + text[: REPEATING - 1], root=text[REPEATING - 1]).repeating


def test_the_index_follows_a_growing_text() -> None:
    lookup, tokens = TextLookup(), [3, 1, 4, 1, 5]
    assert lookup.match(tokens, root=9).draft(1) == ()
    tokens += [9, 2] * 700  # indexed as it grows
    assert lookup.match(tokens, root=9).draft(3) == (2, 9, 2)


def _latest_longest(tokens: list[int], root: int, max_match: int, candidates: int) -> tuple[int, int] | None:
    """(length, end) of the match `TextLookup` documents, by brute force: among the latest `candidates`
    earlier ends of the last 3 tokens, the longest run of tokens before them equal to the text's, then the latest."""
    text = [*tokens, root]
    n = len(tokens)
    ends = [i for i in range(2, n) if text[i - 2 : i + 1] == text[n - 2 : n + 1]][-candidates:]
    best = None
    for end in ends:
        length = 0
        longest = min(max_match, n - 1, end)
        while length < longest and text[end - 1 - length] == text[n - 1 - length]:
            length += 1
        if length >= TextLookup.KEY - 1 and (best is None or (length, end) >= best):
            best = (length, end)
    return best


def test_matches_equal_a_brute_force_search_as_the_text_grows() -> None:
    rng = random.Random(5)
    lookup, tokens = TextLookup(max_match=8), []
    for _ in range(600):  # a few words and their repeats: many matches, ties and loops
        tokens += rng.choice([[rng.randrange(6)], rng.choice([[1, 2, 3], [4, 1, 2, 3, 5], [2, 2, 2]])])
        root = rng.randrange(6)
        match, expected = lookup.match(tokens, root), _latest_longest(tokens, root, 8, TextLookup.CANDIDATES)
        if expected is None:
            assert match.period == 0
        else:
            assert (match.length, match.period) == (expected[0], len(tokens) - expected[1])


SAMPLED = SamplingConfig(temperature=1.0, seed=3)


@pytest.mark.parametrize("sampling", [SamplingConfig(), SAMPLED], ids=["greedy", "sampled"])
def test_lookup_drafts_are_lossless_and_accepted_whole_on_a_loop(sampling: SamplingConfig) -> None:
    target = tiny_target("llama-mha", seed=2)
    prompt = random_prompt(10, seed=6) * 8  # the tiny model copies the loop: the lookup's draft is right
    cfg = RunConfig(max_new_tokens=160, sampling=sampling, draft=DraftConfig(source="lookup", lookup_length=16))
    fast, stats = generate_tokens(target, None, prompt, cfg)
    plain, _ = generate_tokens(target, None, prompt, RunConfig(max_new_tokens=160, mode="plain", sampling=sampling))
    assert first_divergence(fast, plain) is None
    if sampling.greedy:
        assert stats.mean_accepted > 4


def test_repeating_text_is_tuned_apart() -> None:
    plain, lookup = Plan(PlainDrafter, DraftConfig()), Plan(LookupDrafter, DraftConfig(source="lookup"))
    tuners = Tuners([plain, lookup])
    for repeating, accepted in ((False, 0), (True, 16)):  # fresh prose: nothing; a loop: the whole chain
        for _ in range(30):
            tuner = tuners[repeating]
            tuner.observe(lookup, accepted, 17)
            plan = tuner.next()
            tuner.record(
                plan,
                accepted + 1 if plan == lookup else 1,
                0.04 if plan == lookup else 0.01,
                rows=17 if plan == lookup else 1,
            )
    assert tuners[False].next() == plain and tuners[True].next() == lookup


def test_repeating_text_tries_only_plain_steps_and_lookups() -> None:
    plans = candidate_plans(RunConfig(max_new_tokens=10, draft=DraftConfig(auto=True)), num_heads=3)
    tuners = Tuners(plans)
    assert {a.plan.source for a in tuners[True].arms} == {"plain", "lookup"}
    assert len(tuners[False].arms) == len(plans)
    only_pass = Tuners([Plan(PassDrafter, DraftConfig())])
    assert [a.plan.source for a in only_pass[True].arms] == ["pass"]  # nothing to restrict to: as configured
