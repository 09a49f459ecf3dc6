"""The decode loop: TokenSwift's iteration as in DESIGN.md, and plain decoding through the same code.

Plain decoding is the same loop with no drafts: the trie is the root alone. Both share the sampler,
the caches and the stopping rule, so that comparisons between them are fair.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from .config import RunConfig
from .draft import candidates, draft
from .heads import DraftHeads
from .metrics import Stats
from .state import GenerationState, prefill
from .target import Target
from .verify import accept, verify


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
    stats, device, accelerated = state.stats, target.device, cfg.mode == "tokenswift"
    depth_cap = max(len(cfg.draft.tree), cfg.draft.ngram_size if cfg.draft.ngram_top_k else 0)
    while not state.finished(cfg):
        with stats.phase("draft", device):  # 1. draft pass on the partial cache
            drafts = None
            if accelerated:
                cache = state.draft_cache()
                drafts = draft(
                    target, heads, state.root, cache, history=state.tokens, cfg=cfg.draft, sampling=cfg.sampling
                )
        with stats.phase("candidates"):  # 2. template + n-gram candidates merged into one trie
            tree = candidates(state.root, drafts, state.ngrams, cfg.draft)
        with stats.phase("verify", device):  # 3. one forward over the trie against the full cache
            verified = verify(target, tree, state.full)
        with stats.phase("accept"):  # 4. walk the trie with position-keyed target draws
            accepted = accept(tree, verified.logits, state.tokens, cfg.sampling)
        with stats.phase("commit", device):  # 5-6. compact caches, refresh partial cache, count n-grams
            emitted = state.commit(accepted, verified.queries, cfg, eos_ids)
        stats.iterations += 1
        stats.generated += len(emitted)
        stats.accepted += len(accepted.tokens)
        stats.accepted_ngram += accepted.from_ngram
        stats.draft_slots += depth_cap if accelerated else 0
        stats.tree_nodes += tree.size
        yield StepEvent(tokens=tuple(emitted), accepted=len(accepted.tokens), tree_size=tree.size, stats=stats)


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
