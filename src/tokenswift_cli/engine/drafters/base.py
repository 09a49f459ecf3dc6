"""What a drafter is: it proposes each iteration's drafts and learns from what the iteration accepted.

As `transformers`' `CandidateGenerator` (`get_candidates`, `update_candidate_strategy`), with one
more hook: an iteration's commit moves the text on, and the tuner (auto/drafter.py) must see the
verification before it (its shadows read the n-gram table as the iteration drafted with it) and
the clock after it (an iteration's cost includes its commit).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar, Protocol

from tokenswift_cli.config import DraftConfig, SamplingConfig
from tokenswift_cli.engine.state import GenerationState
from tokenswift_cli.engine.tree import Tree
from tokenswift_cli.engine.verify import Acceptance, Verified
from tokenswift_cli.model.heads import DraftHeads
from tokenswift_cli.model.target import Target


@dataclass(frozen=True)
class Drafts:
    """The trie's inputs below the root (engine/candidates.py merges them with the n-gram table).

    `levels` holds the top tokens per depth, all combinations candidates (the tree template).
    `ngram_top_k` continuations from the n-gram table extend each level-1 token (the paper), or the
    root itself when `ngrams_from_root`; None adds none. `chain` is a lookup's draft after the root.
    """

    levels: tuple[tuple[int, ...], ...] = ()
    ngram_top_k: int | None = None
    ngrams_from_root: bool = False
    chain: tuple[int, ...] = ()


@dataclass(frozen=True)
class Step:
    """One iteration as verified: the trie, the verification's outputs and the acceptance walk."""

    tree: Tree
    verified: Verified
    accepted: Acceptance


@dataclass(frozen=True)
class DraftModel:
    """What drafters that read the model draft with: the target, its heads (None: none), the sampling
    that ranks their candidates as the target would draw them."""

    target: Target
    heads: DraftHeads | None
    sampling: SamplingConfig


class Drafter(Protocol):
    """The decode loop's drafter: one source (below), or the tuner choosing among them (auto/)."""

    def propose(self, state: GenerationState) -> Drafts | None:
        """The drafts to verify below `state.root`; None verifies the root alone (a plain step)."""
        ...

    def update(self, state: GenerationState, step: Step) -> None:
        """Learn from `step`, before its commit: `state` still holds the text the drafts were made on."""
        ...

    def committed(self, state: GenerationState) -> None:
        """The iteration's tokens are committed: `state` holds the text that followed."""
        ...

    @property
    def depth_cap(self) -> int:
        """The deepest draft of this iteration (the paper's K + 1 slots of alpha)."""
        ...


class SourceDrafter(ABC):
    """A drafter with one source and fixed settings: one of the plans the tuner chooses among."""

    name: ClassVar[str]  # the source as `--draft`, plan names and logs spell it
    reads_model: ClassVar[bool] = True  # False: drafts from the text alone (free to shadow)
    draft_pass: ClassVar[bool] = False  # runs a forward of its own before the verification

    def __init__(self, draft: DraftConfig, model: DraftModel) -> None:
        self.draft, self.model = draft, model

    @classmethod
    @abstractmethod
    def slots(cls, draft: DraftConfig) -> int:
        """The deepest draft that `draft`'s settings allow."""

    @classmethod
    def label(cls, draft: DraftConfig) -> str:
        """The plan's name in logs: the source and the settings it reads."""
        return cls.name

    @abstractmethod
    def propose(self, state: GenerationState) -> Drafts | None: ...

    def update(self, state: GenerationState, step: Step) -> None:  # noqa: B027 (most sources learn nothing)
        """Nothing to learn: most sources draft from the state alone."""

    def committed(self, state: GenerationState) -> None:  # noqa: B027 (no source follows the text)
        """Nothing to follow."""

    @property
    def depth_cap(self) -> int:
        return self.slots(self.draft)
