"""Drafts from the n-gram table alone (prompt lookup in TokenSwift's loop): the root's continuations.

No heads: their vocabulary-wide logits cost a CPU more than a short draft gains when the text
repeats itself.
"""

from __future__ import annotations

from tokenswift_cli.config import DraftConfig
from tokenswift_cli.engine.drafters.base import Drafts, SourceDrafter
from tokenswift_cli.engine.state import GenerationState


class NGramDrafter(SourceDrafter):
    """The `ngram_top_k` most frequent continuations of the root in the text so far."""

    name = "ngram"
    reads_model = False

    @classmethod
    def slots(cls, draft: DraftConfig) -> int:
        return draft.ngram_size - 1 if draft.ngram_top_k else 0

    @classmethod
    def label(cls, draft: DraftConfig) -> str:
        return f"ngram{draft.ngram_top_k or 0}"

    def propose(self, state: GenerationState) -> Drafts:
        return Drafts(ngram_top_k=self.draft.ngram_top_k, ngrams_from_root=True)
