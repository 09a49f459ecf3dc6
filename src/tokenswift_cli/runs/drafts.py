"""How a run's drafts are described: the panel, the log line, the done note and `runs show` say the same.

alpha counts the draft slots of the steps that drafted; tokens per step counts every step. With
`--draft auto` the tuner runs plain steps wherever they are faster (sampled prose on a CPU: nearly
always), so a run can accept a quarter of its few drafts and still write 1.00 tokens per step. Shown
side by side without their spans, those two figures read as a contradiction ("alpha 0.25, 1.00
tokens/step"): these words say which steps each figure counts, and why drafts are off.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:  # metrics imports torch, which `tokenswift runs` (runs show) never loads
    from tokenswift_cli.config import RunConfig
    from tokenswift_cli.engine.metrics import Stats

Drafting = Literal["auto", "fixed", "plain"]  # the tuner picks per step; one --draft; --mode plain
FASTER = "plain steps are faster here"


@dataclass(frozen=True)
class DraftFigures:
    """A run's drafting so far: how it drafts, its steps, those that drafted and what they accepted."""

    drafting: Drafting
    steps: int
    drafted_steps: int | None  # None: unknown (resumed from a checkpoint older than the count)
    alpha: float  # accepted drafts per draft slot, over the steps that drafted
    tokens_per_step: float  # over every step
    ngram_share: float  # accepted draft tokens that the n-gram table proposed

    @classmethod
    def of(cls, stats: Stats, cfg: RunConfig) -> DraftFigures:
        return cls(
            drafting_of(cfg.mode, cfg.draft.auto), stats.iterations, stats.drafted_iterations, stats.alpha,
            stats.mean_accepted, stats.accepted_ngram / stats.accepted if stats.accepted else 0.0,
        )  # fmt: skip

    @classmethod
    def recorded(cls, stats: dict[str, Any], run_config: dict[str, Any]) -> DraftFigures:
        """From a checkpoint's statistics (`Stats.to_dict`) and a run's settings, as `runs` reads them."""
        drafted = stats.get("drafted_iterations")
        if drafted is None and not stats.get("draft_slots"):  # no slot: no step drafted, whenever written
            drafted = 0
        accepted = stats.get("accepted", 0)
        return cls(
            drafting_of(run_config["mode"], bool(run_config["draft"].get("auto"))), stats.get("iterations", 0),
            drafted, stats.get("alpha", 0.0), stats.get("mean_accepted", 0.0),
            stats.get("accepted_ngram", 0) / accepted if accepted else 0.0,
        )  # fmt: skip

    @property
    def off(self) -> bool:
        """No step drafted (plain decoding, or plain steps were faster throughout)."""
        return self.drafting == "plain" or self.drafted_steps == 0


def drafting_of(mode: str, auto: bool) -> Drafting:
    return "plain" if mode == "plain" else "auto" if auto else "fixed"


def describe(figures: DraftFigures, *, drafting_now: bool | None = None, sep: str = " · ") -> str:
    """The drafts in words: off and why, or alpha over the steps that drafted, and tokens per step over all.

    `drafting_now`: whether the latest steps drafted (the panel and the log know; None: not known).
    `sep`: between the parts (the panel's dot; a comma in log lines)."""
    f = figures
    per_step = f"{f.tokens_per_step:.2f} tokens/step"
    ngrams = [f"n-gram share {100 * f.ngram_share:.0f}%"] if f.alpha > 0 else []  # of accepted drafts: none, no share
    if f.drafting == "plain":
        parts = ["off (--mode plain)", per_step]
    elif f.steps == 0:  # stopped before its first step: nothing drafted, nothing decided
        parts = ["no step yet"]
    elif f.drafted_steps is None:  # how many steps drafted is unknown: name each figure's span
        parts = [f"alpha {f.alpha:.2f} over the steps that drafted", f"{per_step} over all"]
    elif f.drafted_steps == 0:
        why = FASTER if f.drafting == "auto" else "the draft settings draft nothing"
        parts = [f"off: {why}", per_step]
    elif f.drafted_steps >= f.steps:
        parts = [f"alpha {f.alpha:.2f}", per_step, *ngrams]
    else:
        share = _percent(f.drafted_steps / f.steps)
        if drafting_now is False or (drafting_now is None and 2 * f.drafted_steps < f.steps):
            off = "off now" if drafting_now is False else "mostly off"
            parts = [f"{off}: {FASTER}", f"{share} of steps drafted, alpha {f.alpha:.2f} on those", per_step]
        else:
            parts = [f"on in {share} of steps (plain steps where faster)", f"alpha {f.alpha:.2f} on those", per_step,
                     *ngrams]  # fmt: skip
    return sep.join(parts)


def _percent(share: float) -> str:
    """A share of steps with the digits that keep it consistent with the other figures (1.5%, not 2%)."""
    if share < 0.001:
        return "<0.1%"
    return f"{100 * share:.1f}%" if share < 0.1 else f"{100 * share:.0f}%"
