"""Lookup drafts: a chain, what followed the latest earlier match of the text's end (engine/lookup.py).

Long where the text repeats whole stretches; where the root never occurred after the same tokens,
there is nothing to look up and the iteration is a plain step.
"""

from __future__ import annotations

from tokenswift_cli.config import DraftConfig
from tokenswift_cli.engine.drafters.base import Drafts, SourceDrafter
from tokenswift_cli.engine.state import GenerationState


class LookupDrafter(SourceDrafter):
    """Up to `lookup_length` tokens after the root, from the text's own earlier occurrence."""

    name = "lookup"
    reads_model = False

    @classmethod
    def slots(cls, draft: DraftConfig) -> int:
        return draft.lookup_length or 0

    @classmethod
    def label(cls, draft: DraftConfig) -> str:
        return f"lookup{draft.lookup_length or 0}"

    def propose(self, state: GenerationState) -> Drafts | None:
        chain = state.lookup.match(state.tokens, state.root).draft(self.draft.lookup_length or 0)
        return Drafts(chain=chain) if chain else None
