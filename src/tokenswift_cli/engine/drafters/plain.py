"""No drafts: the trie is the root alone, and an iteration is a plain decoding step."""

from __future__ import annotations

from tokenswift_cli.config import DraftConfig
from tokenswift_cli.engine.drafters.base import SourceDrafter
from tokenswift_cli.engine.state import GenerationState


class PlainDrafter(SourceDrafter):
    """Plain decoding through the same loop, so that comparisons with the drafters are fair."""

    name = "plain"
    reads_model = False

    @classmethod
    def slots(cls, draft: DraftConfig) -> int:
        return 0

    def propose(self, state: GenerationState) -> None:
        return None
