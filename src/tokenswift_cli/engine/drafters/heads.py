"""Drafting from the heads: what both head drafters share.

The draft pass (draft_pass.py) and the Medusa-style drafter (from_verify.py) differ in the state
the heads read; both rank each depth's logits as the target would draw (ranking.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tokenswift_cli.config import DraftConfig
from tokenswift_cli.engine.drafters.base import Drafts, SourceDrafter
from tokenswift_cli.model.heads import DraftHeads
from tokenswift_cli.model.target import Target


def head_logits(target: Target, heads: DraftHeads, pre_norm: torch.Tensor) -> torch.Tensor:
    """Logits `[K, vocab]` of the heads fed with one pre-norm state `[hidden]`."""
    with torch.no_grad():
        states = heads(pre_norm.to(next(heads.parameters())))  # [K, hidden]
    return target.logits(states)


class HeadDrafter(SourceDrafter):
    """A source whose levels are the top tokens of rows of logits: the base logits and the heads'."""

    ngrams_from_root: bool  # n-grams continue the root, not each level-1 token

    @classmethod
    def slots(cls, draft: DraftConfig) -> int:
        return max(len(draft.tree), draft.ngram_size if draft.ngram_top_k else 0)

    @classmethod
    def label(cls, draft: DraftConfig) -> str:
        return f"{cls.name}[{','.join(map(str, draft.tree))}]+ngram{draft.ngram_top_k or 0}"

    def drafts_from(self, ranked: Sequence[Sequence[int]]) -> Drafts:
        """The drafts of the tree template over `ranked` (candidates per depth, best first, at least as wide)."""
        levels = tuple(tuple(top[:width]) for top, width in zip(ranked, self.draft.tree, strict=False))
        return Drafts(levels=levels, ngram_top_k=self.draft.ngram_top_k, ngrams_from_root=self.ngrams_from_root)
