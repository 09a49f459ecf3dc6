"""Acceptance without verification: drafts no iteration verified, scored on the text that followed.

The acceptance walk draws each position's token as plain decoding does (verify.accept), so the
draft tokens a tree would have accepted are its longest path that the committed text continues. A
few tokens later that is known at the cost of a dictionary walk, for any plan: the tuner
(tuner.py) learns every plan's acceptance this way and runs a plan only where it pays.

The drafts are the plans' own (their drafters', then `candidates.candidate_trie`), with one
approximation: a draft pass's shadow reads the root's logits and state from the verification pass
(full cache), not from a pass over the partial cache, so it runs no extra forward.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tokenswift_cli.engine.auto.tuner import Plan, Tuner
from tokenswift_cli.engine.candidates import candidate_trie
from tokenswift_cli.engine.drafters.base import DraftModel, SourceDrafter, Step
from tokenswift_cli.engine.drafters.heads import HeadDrafter, head_logits
from tokenswift_cli.engine.drafters.ranking import rank
from tokenswift_cli.engine.state import GenerationState
from tokenswift_cli.engine.tree import Tree, TreeBuilder


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
        members: Mapping[Plan, SourceDrafter],
        state: GenerationState,
        step: Step,
        *,
        model: DraftModel,
    ) -> None:
        """Draft, within the budget, what `tuner`'s plans (their drafters in `members`) would have at
        this iteration, before its commit."""
        plans, start = tuner.shadowed(), len(state.tokens) + 1
        if not plans:  # one plan, nothing to choose
            return
        shadowed = {plan: members[plan] for plan in plans}
        budget = self._share * (time.perf_counter() - self._began)
        for kind in self._spent:
            if self._spent[kind] > budget:
                continue
            began = time.perf_counter()
            if kind == "free":
                tries = _free_tries(state, shadowed)
            else:
                tries = _head_tries(model, state, shadowed, step)
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


def _free_tries(state: GenerationState, members: Mapping[Plan, SourceDrafter]) -> list[tuple[Plan, TreeBuilder, int]]:
    """The tries of the plans that draft from the text alone (n-grams, lookups), rooted at the root."""
    return [
        (plan, candidate_trie(state.root, member.propose(state), state.ngrams), 0)
        for plan, member in members.items()
        if not member.reads_model
    ]


def _head_tries(
    model: DraftModel, state: GenerationState, members: Mapping[Plan, SourceDrafter], step: Step
) -> list[tuple[Plan, TreeBuilder, int]]:
    """The tries of the plans that draft from the heads, with how far past the root each starts.

    The heads run once, on the root's state: with the root's own logits that is a draft pass's draft
    for the root, and, when the walk accepted nothing (the root's state drew the next root), the
    Medusa-style draft of the next iteration. Each row's target scores serve every width (the next
    root's draft scores its rows after the root's context, a token short: an estimate).
    """
    wanted = {
        plan: member
        for plan, member in members.items()
        if isinstance(member, HeadDrafter) and (member.draft_pass or not step.accepted.nodes)
    }
    if model.heads is None or not wanted:
        return []
    head_rows = head_logits(model.target, model.heads, step.verified.pre_norm[0])  # [K, vocab]
    rows = [step.verified.logits[0], *head_rows]  # depths 1, 2, ... below the root
    widest = max(max(p.draft.tree, default=1) for p in wanted)
    ranked = rank(model.target, rows, state, [widest] * len(rows), model.sampling)
    tries = []
    for plan, member in wanted.items():
        if member.draft_pass:  # the root's own rows: the draft pass's draft for the root
            tries.append((plan, candidate_trie(state.root, member.drafts_from(ranked), state.ngrams), 0))
        else:  # the heads on the state that drew the next root: the next iteration's draft
            trie = candidate_trie(step.accepted.next_root, member.drafts_from(ranked[1:]), state.ngrams)
            tries.append((plan, trie, 1))
    return tries
