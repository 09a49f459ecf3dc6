"""The candidate trie (TokenSwift step 2): a drafter's drafts and the n-gram table, merged.

The tree template's combinations and, for each level-1 token (or the root), its top n-gram
continuations in the text so far; or a lookup's chain. Every distinct prefix appears once.
"""

from __future__ import annotations

from tokenswift_cli.engine.drafters.base import Drafts
from tokenswift_cli.engine.ngram import NGramTable
from tokenswift_cli.engine.tree import Tree, TreeBuilder, trie


def candidates(root: int, drafts: Drafts | None, ngrams: NGramTable) -> Tree:
    """The trie below `root` that one verification forward scores (the root alone for no drafts)."""
    return candidate_trie(root, drafts, ngrams).build()


def candidate_trie(root: int, drafts: Drafts | None, ngrams: NGramTable) -> TreeBuilder:
    """`candidates` before the forward's tensors: enough to walk it."""
    if drafts is None:
        return trie(root, [])
    if drafts.chain:
        return trie(root, [], [drafts.chain])
    k = drafts.ngram_top_k
    ngram_paths: list[tuple[int, ...]] = []
    if k is not None and drafts.ngrams_from_root:
        ngram_paths = list(ngrams.top(root, k))
    elif k is not None:
        for first in drafts.levels[0]:
            ngram_paths += [(first, *rest) for rest in ngrams.top(first, k)]
    return trie(root, drafts.levels, ngram_paths)
