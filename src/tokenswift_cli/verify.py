"""Verification (TokenSwift steps 3 and 4): one forward over the trie, then the acceptance walk.

Naming follows the paper: `p` is the target distribution. The walk draws, at each visited node,
the target token for the next position from that node's logits and that node's own context; if a
child carries it, the walk moves there, else the drawn token becomes the next root. Each node is
sampled once, with the position-keyed uniform, so the output is exactly the target's (the
reference draws once per leaf path, which biases towards the drafts).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .cache import FullCache
from .config import SamplingConfig
from .sampling import choose
from .target import QueryCapture, Target
from .tree import Tree


@dataclass(frozen=True)
class Verified:
    """Logits `[nodes, vocab]` of a verification forward and the root's per-layer queries."""

    logits: torch.Tensor
    queries: list[torch.Tensor]


@dataclass(frozen=True)
class Acceptance:
    nodes: tuple[int, ...]  # accepted trie nodes after the root, root to leaf
    tokens: tuple[int, ...]  # their tokens
    next_root: int  # the token drawn where the walk stopped
    from_ngram: int  # accepted nodes proposed by the n-gram table


def verify(target: Target, tree: Tree, cache: FullCache) -> Verified:
    """Score every trie node against the full cache in one forward (tree mask, positions n + depth)."""
    capture = QueryCapture(row=0)
    forward = target.forward(tree.tokens, cache, depths=tree.depths, block_mask=tree.mask, capture=capture)
    return Verified(logits=target.logits(forward.hidden), queries=capture.ordered())


def accept(tree: Tree, logits: torch.Tensor, history: Sequence[int], cfg: SamplingConfig) -> Acceptance:
    """Walk the trie from the root; `history` holds the committed tokens (the root not included)."""
    tail = list(history[-cfg.penalty_window :])
    node, path = 0, [int(tree.tokens[0])]
    nodes: list[int] = []
    while True:
        position = len(history) + len(path)  # absolute position of the token drawn now
        context = torch.tensor(tail + path, dtype=torch.long)
        drawn = choose(logits[node], context, position, cfg)
        child = tree.children[node].get(drawn)
        if child is None:
            break
        node = child
        nodes.append(child)
        path.append(drawn)
    return Acceptance(
        nodes=tuple(nodes),
        tokens=tuple(path[1:]),
        next_root=drawn,
        from_ngram=sum(tree.from_ngram[n] for n in nodes),
    )
