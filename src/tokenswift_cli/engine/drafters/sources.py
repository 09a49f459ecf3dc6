"""The draft sources by the name `--draft` (`DraftConfig.source`) gives them."""

from __future__ import annotations

from tokenswift_cli.engine.drafters.base import SourceDrafter
from tokenswift_cli.engine.drafters.draft_pass import PassDrafter
from tokenswift_cli.engine.drafters.from_verify import VerifyDrafter
from tokenswift_cli.engine.drafters.lookup import LookupDrafter
from tokenswift_cli.engine.drafters.ngrams import NGramDrafter

SOURCES: dict[str, type[SourceDrafter]] = {d.name: d for d in (PassDrafter, VerifyDrafter, NGramDrafter, LookupDrafter)}
