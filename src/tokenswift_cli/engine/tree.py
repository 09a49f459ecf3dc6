"""The token trie verified in one forward (TokenSwift step 2).

Node 0 is the root: the pending token, already sampled. Every other node is a candidate token
whose parent precedes it, so a node's ancestors are its path from the root. Candidate paths from
the heads and from the n-gram table are merged, so that every distinct prefix appears once.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Tree:
    """A trie of candidate tokens, as the tensors a verification forward needs."""

    tokens: torch.Tensor  # [nodes] long; tokens[0] is the root
    parents: tuple[int, ...]  # parents[0] == -1
    depths: torch.Tensor  # [nodes] long; root depth 0
    mask: torch.Tensor  # [nodes, nodes] bool; mask[i, j]: node j is i itself or an ancestor of i
    children: tuple[dict[int, int], ...]  # per node: token -> child node
    from_ngram: tuple[bool, ...]  # the node lies on a path the n-gram table proposed
    token_ids: tuple[int, ...]  # `tokens` on the host
    max_depth: int

    @property
    def size(self) -> int:
        return len(self.parents)

    def path_tokens(self, node: int) -> list[int]:
        """Tokens from the root to `node`, both included."""
        path = []
        while node >= 0:
            path.append(self.token_ids[node])
            node = self.parents[node]
        return path[::-1]


class TreeBuilder:
    """Inserts candidate paths below a root, merging shared prefixes."""

    def __init__(self, root: int) -> None:
        self._tokens = [root]
        self._parents = [-1]
        self._depths = [0]
        self._children: list[dict[int, int]] = [{}]
        self._from_ngram = [False]

    def add(self, path: Iterable[int], *, from_ngram: bool = False) -> None:
        """Add the candidate tokens `path` following the root (and all of its prefixes)."""
        node = 0
        for token in path:
            child = self._children[node].get(token)
            if child is None:
                child = len(self._tokens)
                self._tokens.append(token)
                self._parents.append(node)
                self._depths.append(self._depths[node] + 1)
                self._children.append({})
                self._from_ngram.append(from_ngram)
                self._children[node][token] = child
            elif from_ngram:
                self._from_ngram[child] = True
            node = child

    @property
    def size(self) -> int:
        return len(self._tokens)

    @property
    def children(self) -> list[dict[int, int]]:
        """Per node: token -> child node (all a walk needs; `build` adds the forward's tensors)."""
        return self._children

    def build(self) -> Tree:
        size = len(self._tokens)
        mask = torch.zeros(size, size, dtype=torch.bool)
        rows = torch.arange(size)
        up = torch.tensor([max(parent, 0) for parent in self._parents])  # the root is its own parent
        ancestor = rows
        for _ in range(max(self._depths) + 1):  # a few ops per level, not per node: host time on a GPU
            mask[rows, ancestor] = True
            ancestor = up[ancestor]
        return Tree(
            tokens=torch.tensor(self._tokens, dtype=torch.long),
            parents=tuple(self._parents),
            depths=torch.tensor(self._depths, dtype=torch.long),
            mask=mask,
            children=tuple(self._children),
            from_ngram=tuple(self._from_ngram),
            token_ids=tuple(self._tokens),
            max_depth=max(self._depths),
        )


def template_paths(levels: Sequence[Sequence[int]]) -> list[tuple[int, ...]]:
    """All combinations of one candidate per level: the tree template, e.g. widths [1, 3, 3, 3]."""
    return list(itertools.product(*levels)) if levels else []


def build_tree(
    root: int,
    levels: Sequence[Sequence[int]],
    ngram_paths: Sequence[Sequence[int]] = (),
) -> Tree:
    """The trie of the template paths over `levels` (top tokens per depth) and the n-gram paths."""
    return trie(root, levels, ngram_paths).build()


def trie(root: int, levels: Sequence[Sequence[int]], ngram_paths: Sequence[Sequence[int]] = ()) -> TreeBuilder:
    """`build_tree`'s trie before its tensors: enough to walk it."""
    builder = TreeBuilder(root)
    for path in template_paths(levels):
        builder.add(path)
    for path in ngram_paths:
        builder.add(path, from_ngram=True)
    return builder
