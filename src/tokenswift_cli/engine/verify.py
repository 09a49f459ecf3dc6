"""Verification (TokenSwift steps 3 and 4): one forward over the trie, then the acceptance walk.

Naming follows the paper: `p` is the target distribution. The walk draws, at each visited node,
the target token for the next position from that node's logits and that node's own context; if a
child carries it, the walk moves there, else the drawn token becomes the next root. Each node is
sampled once, with the position-keyed uniform, so the output is exactly the target's (the
reference draws once per leaf path, which biases towards the drafts).
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from tokenswift_cli.config import SamplingConfig
from tokenswift_cli.engine.tree import Tree
from tokenswift_cli.model.cache import FullCache
from tokenswift_cli.model.target import QueryCapture, Target
from tokenswift_cli.sampling.distribution import choose

# oneDNN's bfloat16 products keep a row's result for any number of rows only up to ~27 rows on this
# CPU (see exact_attention.py): batches stay below, so a node's logits do not depend on its siblings.
LOGITS_BATCH = 16


class NodeLogits:
    """Logits of trie nodes, computed only for the nodes the acceptance walk visits.

    The lm_head over the whole vocabulary costs about one weight read per call and grows with the
    rows on a CPU, while the walk visits only the accepted nodes + 1. A visit computes its node and
    that node's children together, so the next step of the walk is already there; down a chain (a
    lookup's draft) each visit reaches twice as far as the last, since a walk that got that far
    often goes on (2, 4, 8 then 16 rows: 16 rows cost ~4x one here, not 16x).
    """

    def __init__(self, target: Target, tree: Tree, hidden: torch.Tensor) -> None:
        self.target, self._tree, self.hidden = target, tree, hidden  # hidden: [nodes, hidden]
        self._rows: dict[int, torch.Tensor] = {}
        self._reach = 2

    def __getitem__(self, node: int) -> torch.Tensor:
        """Float32 logits `[vocab]` of `node`."""
        if node not in self._rows:
            children = self._tree.children
            batch = [node, *(c for c in children[node].values() if c not in self._rows)]
            while len(batch) < min(self._reach, LOGITS_BATCH) and len(children[batch[-1]]) == 1:
                batch.append(next(iter(children[batch[-1]].values())))  # down the chain
            batch = batch[:LOGITS_BATCH]
            self._reach *= 2
            logits = self.target.logits(self.hidden[batch])  # [len(batch), vocab]
            self._rows.update(zip(batch, logits, strict=True))
        return self._rows[node]

    def keep(self, node: int, row: torch.Tensor) -> None:
        """Keep logits computed elsewhere (the device walk's root row)."""
        self._rows[node] = row


@dataclass(frozen=True)
class Verified:
    """Logits of a verification forward (lazy, per node), its pre-norm states and the root's queries."""

    logits: NodeLogits
    pre_norm: torch.Tensor  # [nodes, hidden]: feeds the heads when drafting from the verification pass
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
    forward = target.forward(tree.tokens, cache, depths=tree.depths, block_mask=tree.mask, capture=capture, exact=True)
    logits = NodeLogits(target, tree, forward.hidden)
    return Verified(logits=logits, pre_norm=forward.pre_norm, queries=capture.ordered())


def accept(tree: Tree, logits: torch.Tensor | NodeLogits, history: Sequence[int], cfg: SamplingConfig) -> Acceptance:
    """Walk the trie from the root; `history` holds the committed tokens (the root not included)."""
    tail = list(history[-cfg.context_length :])
    node, path = 0, [tree.token_ids[0]]
    nodes: list[int] = []
    # the context as one tensor, the tail converted once (a list of ~1K ids per node cost ~0.1 ms)
    buffer = torch.empty(len(tail) + len(tree.token_ids) + 1, dtype=torch.long)  # [tail + longest path]
    if tail:  # through an array: 3x quicker than torch.tensor(list)
        buffer[: len(tail)] = torch.frombuffer(array("q", tail), dtype=torch.long)
    while True:
        position = len(history) + len(path)  # absolute position of the token drawn now
        buffer[len(tail) + len(path) - 1] = path[-1]
        context = buffer[: len(tail) + len(path)]
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
