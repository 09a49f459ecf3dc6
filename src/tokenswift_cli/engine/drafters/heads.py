"""Drafting from the heads: ranking logits as the target would draw, and what both head drafters share.

The draft pass (draft_pass.py) and the Medusa-style drafter (from_verify.py) differ in the state
the heads read; both rank each depth's logits under the target's processing (penalty, filters)
after the root's context, so the candidates look like the target's draws.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch

from tokenswift_cli.config import DraftConfig, SamplingConfig
from tokenswift_cli.engine.drafters.base import Drafts, SourceDrafter
from tokenswift_cli.engine.state import GenerationState
from tokenswift_cli.model.heads import DraftHeads
from tokenswift_cli.model.target import Target
from tokenswift_cli.sampling.distribution import target_scores


def top_tokens(
    logits: torch.Tensor | Sequence[torch.Tensor],
    context: torch.Tensor,
    widths: Sequence[int],
    sampling: SamplingConfig,
) -> tuple[tuple[int, ...], ...]:
    """Top-w tokens of each row of `logits` (`[rows, vocab]`) under the target's processing after `context`."""
    ranked = [
        target_scores(row, context, sampling).topk(width).indices for row, width in zip(logits, widths, strict=False)
    ]
    if not ranked:
        return ()
    flat = torch.cat(ranked).tolist()  # one read-back for every row
    starts = [0, *itertools.accumulate(len(r) for r in ranked)]
    return tuple(tuple(flat[a:b]) for a, b in itertools.pairwise(starts))


def head_logits(target: Target, heads: DraftHeads, pre_norm: torch.Tensor) -> torch.Tensor:
    """Logits `[K, vocab]` of the heads fed with one pre-norm state `[hidden]`."""
    with torch.no_grad():
        states = heads(pre_norm.to(next(heads.parameters())))  # [K, hidden]
    return target.logits(states)


def root_context(state: GenerationState, sampling: SamplingConfig) -> torch.Tensor:
    """The tokens a draw after the root depends on, the root included."""
    return torch.tensor([*state.tokens[-sampling.context_length :], state.root], dtype=torch.long)


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
