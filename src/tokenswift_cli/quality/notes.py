"""The words around `tokenswift eval`'s tables: a line that says what was judged and how, and a note under
a table for each `-` it shows and for a token count a reader could misread.

Token counts: the judge reads a text with its tokenizer, and a model may write a word in pieces that
the tokenizer joins ("A" + "lton" read back as "Alton"), so a 2,000-token run can read back as 1,997
tokens. A run's count is the one it wrote; the rows and measures count the judge's.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tokenswift_cli.quality.report import EvalWindows, QualityReport
from tokenswift_cli.quality.summary import Row
from tokenswift_cli.quality.text import STRETCH_TOKENS
from tokenswift_cli.runs.checkpoint import CheckpointError, read_manifest

NO_JUDGE = "not measured (--no-perplexity)"
PIECES = "the model wrote some words in pieces that the judge's tokenizer joins"


def written_tokens(run_dir: Path | None, text: str) -> int | None:
    """The tokens a run wrote, when its last checkpoint covers all of `text` (its text.txt); None for a
    file, a run without a checkpoint, or text written after the checkpoint (a count would be short)."""
    try:
        manifest = read_manifest(run_dir) if run_dir is not None else None
    except CheckpointError:
        return None
    state = (manifest or {}).get("state", {})
    if "emitted" not in state or state.get("text_bytes") != len(text.encode("utf-8")):
        return None
    return int(state["emitted"])


def _judged_how(head: dict[str, Any], windows: EvalWindows, report: QualityReport) -> str:
    if report.nll is None:
        return f"NLL {NO_JUDGE}"
    judge = "judged by the embedded model" if head["model"] == "default" else f"judged by {head['model']}"
    if windows.window is not None:
        sampled = f", the first {windows.sample:,} tokens of each row" if windows.sample else ""
        return f"{judge} over a sliding window of {windows.window:,} tokens (stride {windows.stride:,}){sampled}"
    window = head.get("context_window")
    seen = (
        f"the engine's context window ({window['size']:,} recent tokens and the first {window['sinks']})"
        if window
        else "the whole text before each token"
    )
    rope = f", YaRN x{head['rope_factor']:g}" if head.get("rope") == "yarn" and head.get("rope_factor") else ""
    return f"{judge} with {seen}{rope}"


def caption(
    source: str, head: dict[str, Any], report: QualityReport, windows: EvalWindows, written: int | None
) -> list[str]:
    """The lines over one text's tables: what was judged, after what, by what; and whose token count."""
    count = f"{written:,} tokens written" if written is not None else f"{report.tokens:,} tokens"
    context = f" after {head['context_tokens']:,} tokens of context" if head.get("context_tokens") else ""
    lines = [f"{source}: {count}{context}; {_judged_how(head, windows, report)}."]
    if written is not None and written != report.tokens:
        lines.append(f"The judge reads these {written:,} tokens as {report.tokens:,} ({PIECES}); the rows count those.")
    return lines


def report_notes(report: QualityReport) -> list[str]:
    """The notes under one text's tables: what its measures mean, and each `-` it shows."""
    notes = []
    if report.nll is None:
        notes.append(f"NLL, ppl: - = {NO_JUDGE}.")
    else:
        notes.append("NLL: the judge's mean negative log-likelihood per token (lower: likelier text); ppl = e^NLL.")
    dashes = report.degenerate is None or any(b.degenerate is None for b in report.buckets)
    dash = f"; - = no whole {STRETCH_TOKENS}-token stretch starts there." if dashes else "."
    notes.append(
        f"degenerate: the share of the {STRETCH_TOKENS}-token stretches starting in the row that run words "
        f"together, loop, list or chant{dash}"
    )
    return notes


def summary_notes(rows: Sequence[Row]) -> list[str]:
    """The notes under the table of several texts: each `-` it shows, and runs read back as other counts."""
    notes = []
    recounted = [r for r in rows if r.written is not None and r.written != r.tokens]
    if recounted:
        read = ", ".join(f"{r.source} as {r.tokens:,}" for r in recounted)
        notes.append(f"tokens: as each run wrote them; the judge reads {read} ({PIECES}), and measures those.")
    if any(r.degenerate_share is None for r in rows):
        notes.append(f"degenerate: - = the text is shorter than one {STRETCH_TOKENS}-token stretch.")
    if any(r.nll is None for r in rows):
        notes.append(f"NLL: - = {NO_JUDGE}.")
    if any(not r.distinct for r in rows):
        notes.append("distinct-n: - = the text has no tokens.")
    if any(r.speed is None for r in rows):
        notes.append("tokens/s, tokens/step: - = a text file, or a run without a checkpoint to read them from.")
    return notes
