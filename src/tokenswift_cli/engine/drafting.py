"""Which drafter a run drafts with: the one place that decides.

`--draft auto` builds the tuner (auto/drafter.py), a composite drafter sized from the CPU's
measured costs; it is opt-in, and a backend that should not tune turns it off here, not in the
loop. A fixed `--draft` builds that source's drafter; plain decoding, the plain drafter.
"""

from __future__ import annotations

from tokenswift_cli.config import RunConfig
from tokenswift_cli.engine.auto.drafter import AutoDrafter
from tokenswift_cli.engine.drafters.base import Drafter, DraftModel
from tokenswift_cli.engine.drafters.plain import PlainDrafter
from tokenswift_cli.engine.drafters.sources import SOURCES
from tokenswift_cli.model.heads import DraftHeads
from tokenswift_cli.model.target import Target


def drafter_for(cfg: RunConfig, target: Target, heads: DraftHeads | None) -> Drafter:
    """The drafter of a run with `cfg` on `target`, with `heads` (None: without)."""
    model = DraftModel(target, heads, cfg.sampling)
    if cfg.mode == "plain":
        return PlainDrafter(cfg.draft, model)
    if cfg.draft.auto:
        return AutoDrafter(cfg, model)
    return SOURCES[cfg.draft.source](cfg.draft, model)
