"""Drafting (TokenSwift steps 1 and 2): the draft pass on the partial cache, then the candidate trie.

The draft pass runs the model on the pending root alone; its base logits give level 1 of the tree
template and the heads, fed with the pre-norm hidden state, the following levels. N-gram
candidates extend each level-1 token with the continuations the text so far repeats most.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .cache import _PreallocatedCache
from .config import DraftConfig, SamplingConfig
from .heads import DraftHeads
from .ngram import NGramTable
from .sampling import target_scores
from .target import Target
from .tree import Tree, build_tree


@dataclass(frozen=True)
class Drafts:
    """Top candidate tokens per depth below the root: level 1 from the base logits, then one per head."""

    levels: tuple[tuple[int, ...], ...]


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
    """One forward of `root` on `cache`; the cache's committed length is left unchanged."""
    forward = target.forward(torch.tensor([root]), cache)
    depth = min(len(cfg.tree), 1 + (heads.num_heads if heads is not None else 0))
    states = [forward.hidden[0]]  # [hidden]
    if depth > 1:
        assert heads is not None
        with torch.no_grad():
            head_states = heads(forward.pre_norm[0].to(next(heads.parameters()).dtype))  # [K, hidden]
        states += list(head_states[: depth - 1])
    logits = target.logits(torch.stack(states))  # [depth, vocab]
    # The penalty (on the committed context) makes the drafts look like what the target will draw.
    context = torch.tensor([*history[-sampling.penalty_window :], root], dtype=torch.long)
    levels = []
    for level, width in enumerate(cfg.tree[:depth]):
        scores = target_scores(logits[level], context, sampling)
        levels.append(tuple(scores.topk(width).indices.tolist()))
    return Drafts(levels=tuple(levels))


def candidates(root: int, drafts: Drafts | None, ngrams: NGramTable, cfg: DraftConfig) -> Tree:
    """The trie of the template combinations and, for each level-1 token, its top n-gram paths."""
    if drafts is None:
        return build_tree(root, [])
    ngram_paths = []
    if cfg.ngram_top_k is not None:
        for first in drafts.levels[0]:
            ngram_paths += [(first, *rest) for rest in ngrams.top(first, cfg.ngram_top_k)]
    return build_tree(root, drafts.levels, ngram_paths)
