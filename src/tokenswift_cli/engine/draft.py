"""Drafting (TokenSwift steps 1 and 2): the draft pass on the partial cache, then the candidate trie.

The draft pass runs the model on the pending root alone; its base logits give level 1 of the tree
template and the heads, fed with the pre-norm hidden state, the following levels. N-gram
candidates extend each level-1 token with the continuations the text so far repeats most.

The Medusa-style variant (`DraftConfig.source == "verify"`) skips the draft pass: the heads read
the pre-norm state that the verification pass already computed for the last accepted node (whose
own logits drew the root), so head i proposes depth i below the root; n-grams continue the root.
On a CPU the draft pass costs about as much as a plain step, which this variant saves. The
"ngram" variant drafts from the n-gram table alone (prompt lookup in TokenSwift's loop): no heads,
whose vocabulary-wide logits cost a CPU more than a short draft gains when the text repeats itself.
The "lookup" variant drafts a chain: what followed the latest earlier match of the text's end
(lookup.py), long where the text repeats whole stretches.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from tokenswift_cli.config import DraftConfig, SamplingConfig
from tokenswift_cli.engine.auto.tuner import Plan
from tokenswift_cli.engine.lookup import NO_MATCH, Match
from tokenswift_cli.engine.ngram import NGramTable
from tokenswift_cli.engine.state import GenerationState
from tokenswift_cli.engine.tree import Tree, TreeBuilder, trie
from tokenswift_cli.model.cache import _PreallocatedCache
from tokenswift_cli.model.heads import DraftHeads
from tokenswift_cli.model.target import Target
from tokenswift_cli.sampling.distribution import target_scores


@dataclass(frozen=True)
class Drafts:
    """Top candidate tokens per depth below the root: level 1 from the base logits, then one per head.

    `ngram_key` "level1" extends each level-1 token with n-grams (the paper), "root" the root itself.
    `chain` is a lookup's draft after the root.
    """

    levels: tuple[tuple[int, ...], ...]
    ngram_key: str = "level1"
    chain: tuple[int, ...] = ()


def _top_levels(
    target: Target, states: list[torch.Tensor], context: torch.Tensor, widths: Sequence[int], sampling: SamplingConfig
) -> tuple[tuple[int, ...], ...]:
    """Top-w tokens per level from normalised states; the penalty makes them look like the target's draws."""
    if not states:
        return ()
    return top_tokens(target.logits(torch.stack(states)), context, widths, sampling)  # logits: [depth, vocab]


def top_tokens(
    logits: Sequence[torch.Tensor], context: torch.Tensor, widths: Sequence[int], sampling: SamplingConfig
) -> tuple[tuple[int, ...], ...]:
    """Top-w tokens of each row of `logits` under the target's processing after `context`."""
    return tuple(
        tuple(target_scores(row, context, sampling).topk(width).indices.tolist())
        for row, width in zip(logits, widths, strict=False)
    )


def head_logits(target: Target, heads: DraftHeads, pre_norm: torch.Tensor) -> torch.Tensor:
    """Logits `[K, vocab]` of the heads fed with one pre-norm state `[hidden]`."""
    with torch.no_grad():
        states = heads(pre_norm.to(next(heads.parameters()).dtype))  # [K, hidden]
    return target.logits(states)


def draft_from_verify(
    target: Target,
    heads: DraftHeads | None,
    root: int,
    leaf_pre_norm: torch.Tensor | None,
    *,
    history: Sequence[int],
    cfg: DraftConfig,
    sampling: SamplingConfig,
) -> Drafts:
    """Medusa-style drafts: heads on the pre-norm state `[hidden]` of the node that drew `root`."""
    context = torch.tensor([*history[-sampling.context_length :], root], dtype=torch.long)
    if heads is None or leaf_pre_norm is None:
        return Drafts(levels=(), ngram_key="root")
    levels = top_tokens(head_logits(target, heads, leaf_pre_norm), context, cfg.tree, sampling)
    return Drafts(levels=levels, ngram_key="root")


def draft(
    target: Target,
    heads: DraftHeads | None,
    root: int,
    cache: _PreallocatedCache,
    *,
    history: Sequence[int],
    cfg: DraftConfig,
    sampling: SamplingConfig,
) -> Drafts:
    """One forward of `root` (at position `len(history)`) on `cache`; its committed length is unchanged."""
    forward = target.forward(torch.tensor([root]), cache, start=len(history))
    depth = min(len(cfg.tree), 1 + (heads.num_heads if heads is not None else 0))
    states = [forward.hidden[0]]  # [hidden]
    if depth > 1:
        assert heads is not None
        with torch.no_grad():
            head_states = heads(forward.pre_norm[0].to(next(heads.parameters()).dtype))  # [K, hidden]
        states += list(head_states[: depth - 1])
    context = torch.tensor([*history[-sampling.context_length :], root], dtype=torch.long)
    return Drafts(levels=_top_levels(target, states, context, cfg.tree, sampling))


def propose(
    target: Target,
    heads: DraftHeads | None,
    state: GenerationState,
    plan: Plan,
    *,
    leaf: torch.Tensor | None,
    match: Match = NO_MATCH,
    sampling: SamplingConfig,
) -> Drafts | None:
    """The drafts of one iteration as `plan` says: none (plain step), a draft pass, from `leaf`, or `match`'s."""
    kwargs = {"history": state.tokens, "cfg": plan.draft, "sampling": sampling}
    if plan.source == "plain":
        return None
    if plan.source == "ngram":
        return Drafts(levels=(), ngram_key="root")
    if plan.source == "lookup":  # nothing to look up (the root never occurred): a plain step
        chain = match.draft(plan.draft.lookup_length or 0)
        return Drafts(levels=(), chain=chain) if chain else None
    if plan.source == "verify":
        return draft_from_verify(target, heads, state.root, leaf, **kwargs)  # type: ignore[arg-type]
    return draft(target, heads, state.root, state.draft_cache(), **kwargs)  # type: ignore[arg-type]


def candidates(root: int, drafts: Drafts | None, ngrams: NGramTable, cfg: DraftConfig) -> Tree:
    """The trie of the template combinations and, for each level-1 token, its top n-gram paths (or a lookup's chain)."""
    return candidate_trie(root, drafts, ngrams, cfg).build()


def candidate_trie(root: int, drafts: Drafts | None, ngrams: NGramTable, cfg: DraftConfig) -> TreeBuilder:
    """`candidates` before the forward's tensors."""
    if drafts is None:
        return trie(root, [])
    if drafts.chain:
        return trie(root, [], [drafts.chain])
    ngram_paths: list[tuple[int, ...]] = []
    if cfg.ngram_top_k is not None and drafts.ngram_key == "root":
        ngram_paths = list(ngrams.top(root, cfg.ngram_top_k))
    elif cfg.ngram_top_k is not None:
        for first in drafts.levels[0]:
            ngram_paths += [(first, *rest) for rest in ngrams.top(first, cfg.ngram_top_k)]
    return trie(root, drafts.levels, ngram_paths)
