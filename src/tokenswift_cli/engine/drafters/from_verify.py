"""Medusa-style drafts: the heads on the state the verification pass already computed.

No draft pass: the heads read the pre-norm state of the last accepted node (whose own logits drew
the root), so head i proposes depth i below the root, and n-grams continue the root. On a CPU a
draft pass costs about as much as a plain step, which this source saves.
"""

from __future__ import annotations

import torch

from tokenswift_cli.config import DraftConfig
from tokenswift_cli.engine.drafters.base import DraftModel, Drafts, Step
from tokenswift_cli.engine.drafters.heads import HeadDrafter, head_logits
from tokenswift_cli.engine.drafters.ranking import rank
from tokenswift_cli.engine.state import GenerationState


class VerifyDrafter(HeadDrafter):
    """Drafts from the pre-norm state `[hidden]` of the node that drew the root (none before the first
    verification of a run, or of a resumed run: then n-grams alone)."""

    name = "verify"
    ngrams_from_root = True

    def __init__(self, draft: DraftConfig, model: DraftModel) -> None:
        super().__init__(draft, model)
        self.leaf: torch.Tensor | None = None

    def propose(self, state: GenerationState) -> Drafts:
        heads, sampling = self.model.heads, self.model.sampling
        if heads is None or self.leaf is None:
            return Drafts(ngram_top_k=self.draft.ngram_top_k, ngrams_from_root=True)
        logits = head_logits(self.model.target, heads, self.leaf)  # [K, vocab]
        return self.drafts_from(rank(self.model.target, logits, state, self.draft.tree, sampling))

    def update(self, state: GenerationState, step: Step) -> None:
        """Keep the state of the node where the walk stopped: its logits drew the next root."""
        nodes = step.accepted.nodes
        self.leaf = step.verified.pre_norm[nodes[-1] if nodes else 0]
