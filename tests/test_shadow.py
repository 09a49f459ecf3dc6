"""Shadows: a draft's acceptance read off the committed text equals what verifying it accepts."""

from __future__ import annotations

import time

import pytest
from helpers import random_heads, random_prompt, tiny_target

from tokenswift_cli.config import DraftConfig, RunConfig, SamplingConfig
from tokenswift_cli.engine import decode
from tokenswift_cli.engine.auto.shadow import Shadows, _head_tries
from tokenswift_cli.engine.auto.tuner import Plan, Tuner
from tokenswift_cli.engine.candidates import candidates
from tokenswift_cli.engine.decode import generate_tokens
from tokenswift_cli.engine.drafters.base import DraftModel, Drafts, Step
from tokenswift_cli.engine.drafters.from_verify import VerifyDrafter
from tokenswift_cli.engine.drafters.lookup import LookupDrafter
from tokenswift_cli.engine.drafters.plain import PlainDrafter
from tokenswift_cli.engine.state import prefill
from tokenswift_cli.engine.tree import Tree, trie
from tokenswift_cli.engine.verify import accept, verify

LOOKUP = Plan(LookupDrafter, DraftConfig(source="lookup", lookup_length=8))
SAMPLED = SamplingConfig(temperature=1.0, min_p=0.1, penalty=1.2, penalty_window=64, seed=5)


class Recorder(Tuner):
    """A tuner that keeps every shadow's result."""

    def __init__(self) -> None:
        super().__init__([Plan(PlainDrafter, DraftConfig()), LOOKUP])
        self.seen: list[tuple[Plan, int, int]] = []

    def observe(self, plan: Plan, accepted: int, rows: int) -> None:
        self.seen.append((plan, accepted, rows))


def test_a_shadow_walks_the_text_until_a_miss_or_a_leaf() -> None:
    tuner, shadows = Recorder(), Shadows()
    shadows.watch(tuner, LOOKUP, trie(5, [], [(1, 2, 3), (1, 4)]), start=1)  # root 5 at index 0
    shadows.follow([5], root=1)  # the text so far: 5, then the pending 1
    assert tuner.seen == [] and len(shadows) == 1
    shadows.follow([5, 1, 4], root=9)  # 1, 4 matched, then a leaf: two tokens, whatever comes next
    assert tuner.seen == [(LOOKUP, 2, 5)] and len(shadows) == 0
    shadows.watch(tuner, LOOKUP, trie(5, [], [(1, 2, 3)]), start=1)
    shadows.follow([5, 1, 2], root=7)  # 7 is not 3: a miss after two
    assert tuner.seen[-1] == (LOOKUP, 2, 4)


@pytest.mark.parametrize("sampling", [SamplingConfig(), SAMPLED], ids=["greedy", "sampled"])
def test_a_shadow_accepts_what_verifying_the_same_draft_accepts(sampling: SamplingConfig) -> None:
    target = tiny_target("llama-gqa", seed=2)
    cfg = RunConfig(max_new_tokens=120, sampling=sampling)
    state = prefill(target, random_prompt(10, seed=6) * 6, cfg)  # a loop the tiny model partly copies
    tuner, shadows, verified_counts = Recorder(), Shadows(), []
    while not state.finished(cfg):
        chain = state.lookup.match(state.tokens, state.root).draft(8)
        tree = candidates(state.root, Drafts(levels=(), chain=chain) if chain else None, state.ngrams)
        shadows.watch(tuner, LOOKUP, tree, start=len(state.tokens) + 1)
        accepted = accept(tree, verify(target, tree, state.full).logits, state.tokens, sampling)
        verified_counts.append(len(accepted.tokens))
        state.commit(accepted, [], cfg)
        shadows.follow(state.tokens, state.root)
    # every shadow but the last few has finished, each with what verification accepted
    assert len(tuner.seen) >= len(verified_counts) - 1
    assert [accepted for _, accepted, _ in tuner.seen] == verified_counts[: len(tuner.seen)]
    assert sum(verified_counts) > 0


class CpuClock:
    """A clock on which only verification takes time, as rows cost on a CPU at long context: one
    plain step (1 ms) plus 0.3 of one per extra row. Shadows then take no time and run every step."""

    def __init__(self) -> None:
        self.now = 0.0

    def verify(self, target: object, tree: Tree, cache: object) -> object:
        self.now += 1e-3 * (1.0 + 0.3 * (tree.size - 1))
        return verify(target, tree, cache)  # type: ignore[arg-type]


def test_auto_mode_on_text_nothing_drafts_runs_plain_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = CpuClock()  # timing on a tiny model is noise (rows nearly free): the costs come from this clock
    monkeypatch.setattr(time, "perf_counter", lambda: clock.now)
    monkeypatch.setattr(decode, "verify", clock.verify)
    target = tiny_target("qwen2", seed=3)
    draft = DraftConfig(auto=True, partial_budget=64, sink_tokens=4, recent_window=16)
    cfg = RunConfig(max_new_tokens=150, sampling=SAMPLED, draft=draft)
    _, stats = generate_tokens(target, random_heads(target), random_prompt(60, seed=8), cfg)
    # Random heads and fresh text: the shadows show nothing accepted, so (almost) no iteration drafts.
    assert stats.iterations >= 140 and stats.tree_nodes - stats.iterations <= 10


def test_a_verify_plans_shadow_is_the_draft_it_proposes_next() -> None:
    target = tiny_target("llama-mha", seed=4)
    heads = random_heads(target)
    cfg = RunConfig(max_new_tokens=20)
    state = prefill(target, random_prompt(30, seed=9), cfg)
    plan = Plan(VerifyDrafter, DraftConfig(source="verify", tree=(2, 2, 1), ngram_top_k=2))
    model = DraftModel(target, heads, cfg.sampling)
    drafter = plan.build(model)
    for _ in range(5):  # plain steps: the root's state draws the next root
        tree = candidates(state.root, None, state.ngrams)
        verified = verify(target, tree, state.full)
        accepted = accept(tree, verified.logits, state.tokens, cfg.sampling)
        step = Step(tree=tree, verified=verified, accepted=accepted)
        (_, shadow, later), *_ = _head_tries(model, state, {plan: drafter}, step)
        drafter.update(state, step)
        state.commit(accepted, verified.queries, cfg)
        drafts = drafter.propose(state)
        real = candidates(state.root, drafts, state.ngrams)
        assert later == 1 and shadow.size == real.size > 1
        assert [dict(c) for c in shadow.children] == [dict(c) for c in real.children]
