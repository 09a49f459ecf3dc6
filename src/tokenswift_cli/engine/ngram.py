"""The n-gram table: n-grams of the text so far (prefix included), counted (TokenSwift step 6).

Deterministic and rebuildable from the tokens alone: ties keep first-seen order.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Sequence


class NGramTable:
    """Counts of n-grams keyed by their first token; proposes the continuations seen most often."""

    def __init__(self, n: int = 4) -> None:
        self.n = n
        self.counts: dict[int, Counter[tuple[int, ...]]] = {}
        self.indexed_until = 0  # n-grams ending before this position are counted

    def update(self, tokens: Sequence[int], until: int) -> None:
        """Count the n-grams of `tokens` that end before position `until` and are not counted yet."""
        first_end = max(self.indexed_until + 1, self.n)
        for end in range(first_end, until + 1):
            gram = tokens[end - self.n : end]
            self.counts.setdefault(gram[0], Counter())[tuple(gram[1:])] += 1
        self.indexed_until = max(self.indexed_until, until)

    def top(self, first: int, k: int) -> list[tuple[int, ...]]:
        """The `k` most frequent continuations (n-1 tokens) of `first`, most frequent first."""
        counter = self.counts.get(first)
        if not counter:
            return []
        return [gram for gram, _ in heapq.nlargest(k, counter.items(), key=lambda item: item[1])]

    def __len__(self) -> int:
        return sum(len(c) for c in self.counts.values())
