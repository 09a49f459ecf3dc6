"""The decode loop: TokenSwift's iteration as in DESIGN.md, and plain decoding through the same code.

Plain decoding is the same loop with no drafts: the trie is the root alone. Both share the sampler,
the caches and the stopping rule, so that comparisons between them are fair.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from tokenswift_cli.config import RunConfig
from tokenswift_cli.engine.auto.shadow import Shadows
from tokenswift_cli.engine.auto.tuner import Plan, Tuners
from tokenswift_cli.engine.draft import candidates, propose
from tokenswift_cli.engine.metrics import Stats
from tokenswift_cli.engine.state import GenerationState, prefill
from tokenswift_cli.engine.tree import Tree
from tokenswift_cli.engine.verify import Acceptance, accept, verify
from tokenswift_cli.model.heads import DraftHeads
from tokenswift_cli.model.target import Target


@dataclass(frozen=True)
class StepEvent:
    """What one iteration produced: newly committed tokens (within the budget) and the running stats."""

    tokens: tuple[int, ...]
    accepted: int  # draft tokens accepted this iteration
    tree_size: int
    stats: Stats


def generate(
    target: Target,
    heads: DraftHeads | None,
    state: GenerationState,
    cfg: RunConfig,
    *,
    eos_ids: Sequence[int] = (),
) -> Iterator[StepEvent]:
    """Extend `state` until `cfg.max_new_tokens` (or an end-of-sequence token); one event per iteration."""
    stats, device = state.stats, target.device
    tuners = Tuners.for_run(cfg, num_heads=heads.num_heads if heads is not None else 0)
    shadows = Shadows()  # the other plans' drafts, scored as the text goes on (their acceptance)
    leaf: torch.Tensor | None = None  # pre-norm state of the node that drew the root
    while not state.finished(cfg):
        started = time.perf_counter()
        match = state.lookup.match(state.tokens, state.root)  # where the text's end occurred before
        tuner = tuners[match.repeating]
        plan = tuner.next()
        with stats.phase("draft", device):  # 1. draft pass, or from the last verification, or a lookup
            drafts = propose(target, heads, state, plan, leaf=leaf, match=match, sampling=cfg.sampling)
        with stats.phase("candidates"):  # 2. template + n-gram candidates merged into one trie
            tree = candidates(state.root, drafts, state.ngrams, plan.draft)
        with stats.phase("verify", device):  # 3. one forward over the trie against the full cache
            verified = verify(target, tree, state.full)
        with stats.phase("accept"):  # 4. walk the trie with position-keyed target draws
            accepted = accept(tree, verified.logits, state.tokens, cfg.sampling)
            leaf = verified.pre_norm[accepted.nodes[-1] if accepted.nodes else 0]
        with stats.phase("shadow"):  # what each plan would have drafted here, scored on the text to come
            shadows.draft(tuner, target, heads, state, match=match, verified=verified, accepted=accepted,
                          sampling=cfg.sampling)  # fmt: skip
        with stats.phase("commit", device):  # 5-6. compact caches, refresh partial cache, count n-grams
            emitted = state.commit(accepted, verified.queries, cfg, eos_ids)
        shadows.follow(state.tokens, state.root)
        tuner.record(plan, len(accepted.tokens) + 1, time.perf_counter() - started, rows=tree.size)
        _count(stats, plan, tree, accepted, emitted)
        yield StepEvent(tokens=tuple(emitted), accepted=len(accepted.tokens), tree_size=tree.size, stats=stats)


def _count(stats: Stats, plan: Plan, tree: Tree, accepted: Acceptance, emitted: Sequence[int]) -> None:
    stats.iterations += 1
    stats.generated += len(emitted)
    stats.accepted += len(accepted.tokens)
    stats.accepted_ngram += accepted.from_ngram
    stats.draft_slots += plan.depth_cap
    stats.tree_nodes += tree.size


def generate_tokens(
    target: Target,
    heads: DraftHeads | None,
    prompt: Sequence[int],
    cfg: RunConfig,
    *,
    eos_ids: Sequence[int] = (),
) -> tuple[list[int], Stats]:
    """Prefill `prompt`, generate, and return the generated tokens with the run's statistics."""
    state = prefill(target, prompt, cfg)
    out: list[int] = []
    for event in generate(target, heads, state, cfg, eos_ids=eos_ids):
        out += event.tokens
    return out, state.stats
