"""Several texts in one table (`tokenswift eval run-001 run-002 run-003`): per text and overall.

Per text: the degenerate share of its 500-token stretches, the judge's NLL, Distinct-1..4 (token-weighted
over its windows), repeated sentences, and, for a run, the speed its checkpoint recorded. Overall:
the degenerate share over all stretches together, the rest weighted by tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenswift_cli.engine.metrics import Stats
from tokenswift_cli.quality.report import QualityReport
from tokenswift_cli.runs.checkpoint import CheckpointError, read_manifest


@dataclass(frozen=True)
class Speed:
    """What a run's last checkpoint recorded: tokens generated, decoding seconds, verification steps."""

    generated: int
    seconds: float
    iterations: int

    @property
    def tokens_per_second(self) -> float:
        return self.generated / self.seconds if self.seconds else 0.0

    @property
    def tokens_per_step(self) -> float:
        return self.generated / self.iterations if self.iterations else 0.0


def run_speed(run_dir: Path | None) -> Speed | None:
    """The speed of the run in `run_dir` (None: not a run, or no checkpoint to read it from)."""
    try:
        manifest = read_manifest(run_dir) if run_dir is not None else None
    except CheckpointError:
        return None
    if manifest is None or "stats" not in manifest.get("state", {}):
        return None
    stats = Stats.from_dict(manifest["state"]["stats"])
    return Speed(stats.generated, stats.decode_seconds, stats.iterations)


@dataclass(frozen=True)
class Row:
    """One line of the table: a text's figures (a source's, or all of them together)."""

    source: str
    tokens: int
    stretches: int
    degenerate: int  # stretches flagged degenerate
    nll: float | None
    distinct: tuple[float, ...]
    repeated_sentences: float
    speed: Speed | None
    written: int | None = None  # the tokens a run wrote (`tokens` is the judge's count: notes.py says why)

    @property
    def shown_tokens(self) -> int:
        """The count the table shows: the run's own where known, else the judge's."""
        return self.written if self.written is not None else self.tokens

    @property
    def degenerate_share(self) -> float | None:
        return self.degenerate / self.stretches if self.stretches else None

    def to_dict(self) -> dict[str, Any]:
        speed = self.speed
        return {
            "source": self.source, "tokens": self.tokens, "written_tokens": self.written,
            "stretches": self.stretches, "degenerate": self.degenerate,
            "degenerate_share": self.degenerate_share, "nll": self.nll, "distinct": list(self.distinct),
            "repeated_sentences": self.repeated_sentences,
            "tokens_per_second": speed.tokens_per_second if speed else None,
            "tokens_per_step": speed.tokens_per_step if speed else None,
        }  # fmt: skip


def row(source: str, report: QualityReport, speed: Speed | None, written: int | None = None) -> Row:
    sizes = [w.end - w.start for w in report.distinct]
    distinct = tuple(
        sum(size * w.distinct[n] for size, w in zip(sizes, report.distinct, strict=True)) / sum(sizes)
        for n in range(4)
    ) if sizes else ()  # fmt: skip
    degenerate = sum(s.degenerate for s in report.stretches)
    return Row(source, report.tokens, len(report.stretches), degenerate, report.nll, distinct,
               report.repeated_sentences, speed, written)  # fmt: skip


def _weighted(rows: Sequence[Row], values: Sequence[float | None]) -> float | None:
    pairs = [(r.tokens, v) for r, v in zip(rows, values, strict=True) if v is not None and r.tokens]
    total = sum(t for t, _ in pairs)
    return sum(t * v for t, v in pairs) / total if total else None


def overall(rows: Sequence[Row]) -> Row:
    """All texts together: stretches pooled, the means weighted by tokens, the speed over all runs' time."""
    with_distinct = [r for r in rows if r.distinct]
    distinct = tuple(_weighted(with_distinct, [r.distinct[n] for r in with_distinct]) or 0.0 for n in range(4))
    speeds = [r.speed for r in rows if r.speed is not None]
    speed = Speed(*(sum(getattr(s, f) for s in speeds) for f in ("generated", "seconds", "iterations")))
    return Row(
        "overall", sum(r.tokens for r in rows), sum(r.stretches for r in rows), sum(r.degenerate for r in rows),
        _weighted(rows, [r.nll for r in rows]), distinct if with_distinct else (),
        _weighted(rows, [r.repeated_sentences for r in rows]) or 0.0, speed if speeds else None,
        sum(r.shown_tokens for r in rows) if any(r.written is not None for r in rows) else None,
    )  # fmt: skip


def _cells(r: Row) -> str:
    share = "-" if r.degenerate_share is None else f"{r.degenerate_share:.0%} ({r.degenerate}/{r.stretches})"
    nll = "-" if r.nll is None else f"{r.nll:.2f}"
    distinct = " | ".join(f"{d:.3f}" for d in r.distinct) if r.distinct else "- | - | - | -"
    speed = "- | -" if r.speed is None else f"{r.speed.tokens_per_second:.1f} | {r.speed.tokens_per_step:.2f}"
    return f"| {r.source} | {r.shown_tokens} | {share} | {nll} | {distinct} | {r.repeated_sentences:.1%} | {speed} |"


def summary_markdown(rows: Sequence[Row]) -> str:
    """One markdown table: a line per text, then the overall line (notes.py says what its dashes mean)."""
    head = [
        "| source | tokens | degenerate | NLL | distinct-1 | distinct-2 | distinct-3 | distinct-4 "
        "| repeated sentences | tokens/s | tokens/step |",
        "| --- " * 11 + "|",
    ]
    return "\n".join([*head, *(_cells(r) for r in rows), _cells(overall(rows))])
