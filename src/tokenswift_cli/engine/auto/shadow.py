"""Acceptance without verification: drafts no iteration verified, scored on the text that followed.

The acceptance walk draws each position's token as plain decoding does (verify.accept), so the
draft tokens a tree would have accepted are its longest path that the committed text continues. A
few tokens later that is known at the cost of a dictionary walk, for any plan: the tuner
(autotune.py) learns every plan's acceptance this way and runs a plan only where it pays.

The drafts are the plans' own (`draft.propose`, `draft.candidates`), with one approximation: a
draft pass's shadow reads the root's logits and state from the verification pass (full cache), not
from a pass over the partial cache, so it runs no extra forward.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from tokenswift_cli.config import SamplingConfig
from tokenswift_cli.engine.auto.tuner import Plan, Tuner
from tokenswift_cli.engine.draft import Drafts, candidate_trie, head_logits, propose, top_tokens
from tokenswift_cli.engine.lookup import Match
from tokenswift_cli.engine.state import GenerationState
from tokenswift_cli.engine.tree import Tree, TreeBuilder
from tokenswift_cli.engine.verify import Acceptance, Verified
from tokenswift_cli.model.heads import DraftHeads
from tokenswift_cli.model.target import Target


@dataclass
class _Watch:
    tuner: Tuner
    plan: Plan
    children: Sequence[dict[int, int]]  # the tree's, per node: token -> child
    rows: int
    start: int  # index in the text of the first token after the tree's root
    node: int = 0
    depth: int = 0  # draft tokens matched so far


class Shadows:
    """The shadows waiting for the text to go on, and the time they may take.

    Drafting shadows costs time: ~0.1 ms for lookups and n-grams, a few ms for the heads (a
    vocabulary-wide row per head). Each kind may take `share` of the time since decoding began, so
    both run on the first iteration, lookups then on almost every one, the heads every few dozen.
    """

    def __init__(self, share: float = 0.005) -> None:
        self._watching: list[_Watch] = []
        self._share, self._began = share, time.perf_counter()
        self._spent = {"free": 0.0, "heads": 0.0}

    def __len__(self) -> int:
        return len(self._watching)

    def draft(
        self,
        tuner: Tuner,
        target: Target,
        heads: DraftHeads | None,
        state: GenerationState,
        *,
        match: Match,
        verified: Verified,
        accepted: Acceptance,
        sampling: SamplingConfig,
    ) -> None:
        """Draft, within the budget, what `tuner`'s plans would have at this iteration (before its commit)."""
        plans, start = tuner.shadowed(), len(state.tokens) + 1
        if not plans:  # one plan, nothing to choose: plain decoding, or a plan given on the command line
            return
        budget = self._share * (time.perf_counter() - self._began)
        for kind in self._spent:
            if self._spent[kind] > budget:
                continue
            began = time.perf_counter()
            if kind == "free":
                tries = _free_tries(target, state, plans, match, sampling)
            else:
                tries = _head_tries(
                    target, heads, state, plans, verified=verified, accepted=accepted, sampling=sampling
                )
            for plan, trie, later in tries:
                self.watch(tuner, plan, trie, start + later)
            self._spent[kind] += time.perf_counter() - began

    def watch(self, tuner: Tuner, plan: Plan, trie: TreeBuilder | Tree, start: int) -> None:
        """Score `plan`'s `trie` for `tuner` on the text from index `start` (the token after its root)."""
        self._watching.append(_Watch(tuner, plan, trie.children, trie.size, start))

    def follow(self, tokens: Sequence[int], root: int) -> None:
        """Walk every shadow down the text so far (`tokens`, then the pending `root`); report the finished ones."""
        known = len(tokens) + 1
        waiting = []
        for w in self._watching:
            while w.start + w.depth < known:
                index = w.start + w.depth
                child = w.children[w.node].get(tokens[index] if index < len(tokens) else root)
                if child is None:
                    break
                w.node, w.depth = child, w.depth + 1
            if w.start + w.depth < known or not w.children[w.node]:  # a miss, or a leaf: finished
                w.tuner.observe(w.plan, w.depth, w.rows)
            else:
                waiting.append(w)
        self._watching = waiting


def _free_tries(
    target: Target, state: GenerationState, plans: Sequence[Plan], match: Match, sampling: SamplingConfig
) -> list[tuple[Plan, TreeBuilder, int]]:
    """The tries of the plans that draft from the text alone (n-grams, lookups), rooted at the root."""
    tries = []
    for plan in plans:
        if plan.source in ("ngram", "lookup"):  # the plans' own drafts: `propose` reads no model for these
            drafts = propose(target, None, state, plan, leaf=None, match=match, sampling=sampling)
            tries.append((plan, candidate_trie(state.root, drafts, state.ngrams, plan.draft), 0))
    return tries


def _head_tries(
    target: Target,
    heads: DraftHeads | None,
    state: GenerationState,
    plans: Sequence[Plan],
    *,
    verified: Verified,
    accepted: Acceptance,
    sampling: SamplingConfig,
) -> list[tuple[Plan, TreeBuilder, int]]:
    """The tries of the plans that draft from the heads, with how far past the root each starts.

    The heads run once, on the root's state: with the root's own logits that is a draft pass's draft
    for the root, and, when the walk accepted nothing (the root's state drew the next root), the
    Medusa-style draft of the next iteration. Each row's target scores serve every width (the next
    root's draft scores its rows after the root's context, a token short: an estimate).
    """
    wanted = [p for p in plans if p.source == "pass" or (p.source == "verify" and not accepted.nodes)]
    if heads is None or not wanted:
        return []
    rows = [verified.logits[0], *head_logits(target, heads, verified.pre_norm[0])]  # depths 1, 2, ... below the root
    context = torch.tensor([*state.tokens[-sampling.context_length :], state.root], dtype=torch.long)
    widest = max(max(p.draft.tree, default=1) for p in wanted)
    ranked = top_tokens(rows, context, [widest] * len(rows), sampling)
    tries = []
    for plan in wanted:
        if plan.source == "pass":
            levels = tuple(tuple(top[:w]) for top, w in zip(ranked, plan.draft.tree, strict=False))
            tries.append((plan, candidate_trie(state.root, Drafts(levels=levels), state.ngrams, plan.draft), 0))
        else:
            levels = tuple(tuple(top[:w]) for top, w in zip(ranked[1:], plan.draft.tree, strict=False))
            drafts = Drafts(levels=levels, ngram_key="root")
            tries.append((plan, candidate_trie(accepted.next_root, drafts, state.ngrams, plan.draft), 1))
    return tries
