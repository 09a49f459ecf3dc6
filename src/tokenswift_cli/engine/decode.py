"""The decode loop: TokenSwift's iteration as in DESIGN.md, and plain decoding through the same code.

Plain decoding is the same loop with the plain drafter: the trie is the root alone. Both share the
sampler, the caches and the stopping rule, so that comparisons between them are fair.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from tokenswift_cli.config import RunConfig
from tokenswift_cli.engine.candidates import candidates
from tokenswift_cli.engine.drafters.base import Step
from tokenswift_cli.engine.drafting import drafter_for
from tokenswift_cli.engine.metrics import Stats
from tokenswift_cli.engine.state import GenerationState, prefill
from tokenswift_cli.engine.verify import accept, verify
from tokenswift_cli.engine.walk import accept_on_device, walks_on_device
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
    drafter = drafter_for(cfg, target, heads)
    walk = accept_on_device if walks_on_device(target.output_device) else accept
    while not state.finished(cfg):
        with stats.phase("draft", device):  # 1. a draft pass, heads on the last verification, a lookup, or none
            drafts = drafter.propose(state)
        with stats.phase("candidates"):  # 2. template + n-gram candidates merged into one trie
            tree = candidates(state.root, drafts, state.ngrams)
        with stats.phase("verify", device):  # 3. one forward over the trie against the full cache
            verified = verify(target, tree, state.full)
        with stats.phase("accept"):  # 4. walk the trie with position-keyed target draws
            accepted = walk(tree, verified.logits, state.tokens, cfg.sampling)
        step = Step(tree=tree, verified=verified, accepted=accepted)
        with stats.phase("shadow"):  # the drafter learns (the tuner: what its other plans would have drafted)
            drafter.update(state, step)
        with stats.phase("commit", device):  # 5-6. compact caches, refresh partial cache, count n-grams
            emitted = state.commit(accepted, verified.queries, cfg, eos_ids)
        drafter.committed(state)
        _count(stats, step, emitted, slots=drafter.depth_cap)
        yield StepEvent(tokens=tuple(emitted), accepted=len(accepted.tokens), tree_size=tree.size, stats=stats)


def _count(stats: Stats, step: Step, emitted: Sequence[int], *, slots: int) -> None:
    stats.iterations += 1
    stats.generated += len(emitted)
    stats.accepted += len(step.accepted.tokens)
    stats.accepted_ngram += step.accepted.from_ngram
    stats.draft_slots += slots
    if stats.drafted_iterations is not None:
        stats.drafted_iterations += slots > 0
    stats.tree_nodes += step.tree.size


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
