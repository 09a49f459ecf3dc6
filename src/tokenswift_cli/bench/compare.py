"""Which texts of a case can be equal, and where they part.

Plain decoding and TokenSwift apply one target distribution, so TokenSwift's text must be plain's
(lossless). `generate()` implements only part of the engine's rules: its text can be the engine's
under greedy decoding when the engine runs none of the rules it lacks. Otherwise the comparison is
not made, and the table says why ("n/a (extra rules: dry, scripts)"), never a misleading "no".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tokenswift_cli.config import RunConfig
from tokenswift_cli.engine.state import kv_storage
from tokenswift_cli.model.target import Target

# generate() draws from torch's random stream, the engine from position-keyed uniforms.
SAMPLED = "sampled"


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first differing token, None when equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def generate_gaps(config: RunConfig, target: Target, context: int) -> tuple[str, ...]:
    """What keeps `generate()` from writing the engine's text under `config` after `context` prefix tokens.

    Empty when the texts must agree: greedy, no DRY, scripts filter, spacing rule, word, capitals or
    whitespace cap, a repetition penalty (if any) whose window holds the whole text (generate()'s covers
    all of it), no context window (generate() attends to everything) and the KV cache stored as the
    model computes it. The end-of-text tokens the engine suppresses, generate() suppresses too
    (`stock.generation_config`).
    """
    sampling = config.sampling
    gaps = [] if sampling.greedy else [SAMPLED]
    if sampling.dry_multiplier is not None:
        gaps.append("dry")
    if sampling.scripts:
        gaps.append("scripts")
    if sampling.spacing:
        gaps.append("spacing")
    if sampling.max_word is not None:
        gaps.append("word cap")
    if sampling.max_capitalised is not None:
        gaps.append("capitals cap")
    if sampling.max_spaces is not None:
        gaps.append("whitespace cap")
    seen = context + config.max_new_tokens - 1  # the text before the last token's draw
    if sampling.penalty not in (None, 1.0) and sampling.penalty_window < seen:
        gaps.append("penalty window")
    if config.context_window is not None:
        gaps.append("context window")
    if kv_storage(config, target) != target.dtype:
        gaps.append("float16 KV cache")
    return tuple(gaps)


@dataclass(frozen=True)
class Equality:
    """A text against a reference: `equal` (None: not compared), where they part, why not compared."""

    equal: bool | None = None
    divergence: int | None = None
    gaps: tuple[str, ...] = ()

    @classmethod
    def of(cls, tokens: Sequence[int], reference: Sequence[int], gaps: tuple[str, ...] = ()) -> Equality:
        if gaps:
            return cls(gaps=gaps)
        at = first_divergence(tokens, reference)
        return cls(at is None, at)

    def label(self) -> str:
        """ "yes", "no @i", or "n/a (...)" with the reasons."""
        if self.equal is not None:
            return "yes" if self.equal else f"no @{self.divergence}"
        if not self.gaps:
            return "-"
        rules = [gap for gap in self.gaps if gap != SAMPLED]
        reasons = ([SAMPLED] if SAMPLED in self.gaps else []) + ([f"extra rules: {', '.join(rules)}"] if rules else [])
        return f"n/a ({'; '.join(reasons)})"
