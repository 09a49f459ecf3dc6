"""The paper's draft (TokenSwift step 1): a forward of the root on the partial cache, then the heads.

The root's base logits give level 1 of the tree template and the heads, fed with its pre-norm
hidden state, the following levels; n-gram candidates extend each level-1 token.
"""

from __future__ import annotations

import torch

from tokenswift_cli.engine.drafters.base import Drafts
from tokenswift_cli.engine.drafters.heads import HeadDrafter
from tokenswift_cli.engine.drafters.ranking import rank
from tokenswift_cli.engine.state import GenerationState


class PassDrafter(HeadDrafter):
    """Drafts with a forward of the root (at position `len(tokens)`) on `state.draft_cache()`, whose
    committed length is unchanged."""

    name = "pass"
    draft_pass = True
    ngrams_from_root = False

    def propose(self, state: GenerationState) -> Drafts:
        target, heads, tree = self.model.target, self.model.heads, self.draft.tree
        forward = target.forward(torch.tensor([state.root]), state.draft_cache(), start=len(state.tokens))
        depth = min(len(tree), 1 + (heads.num_heads if heads is not None else 0))
        states = [forward.hidden[0]]  # [hidden]
        if depth > 1:
            assert heads is not None
            with torch.no_grad():
                head_states = heads(forward.pre_norm[0].to(next(heads.parameters())))  # [K, hidden]
            states += list(head_states[: depth - 1])
        logits = target.logits(torch.stack(states))  # [depth, vocab]
        return self.drafts_from(rank(target, logits, state, tree, self.model.sampling))
