"""Screen sampling settings for long texts over several seeds (issue 24): run, resume, judge, tabulate.

Each (way of asking, setting, seed) is one `tokenswift write` run in --runs-dir; the screen's index
(screen.json there) maps it to its run, so a stopped screen picks up where it was: a finished run
is skipped, a stopped one resumed (`tokenswift resume`), a missing one started; a run whose target
is short of --tokens has it raised (`resume --tokens`), so a 32K screen can be taken on to 100K.
Each finished run is judged (`tokenswift eval --json`, kept as eval.json in its folder), again
once it has been taken further, or when the judge's NLL is asked for and missing (`--judge-sample
N` judges the first N tokens of each bucket: a third of the time at 2048 of 8192). The table
gives per run the degenerate share of its 500-token stretches, the judge's NLL by position,
Distinct-1..4, repeated sentences, tokens/s and tokens per step. Example (the issue's first screen):

    .venv/bin/python benchmarks/quality_screen.py --runs-dir runs/screen --tokens 32k --seeds 1 2 3 \\
        --setting defaults= --setting t0.85='--temperature 0.85' --json /tmp/quality-screen.json

Runs use one thread (--threads) so two screens can share a 2-core machine; nothing here is timed
against anything else, so tokens/s is only indicative.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tokenswift_cli.parsing import parse_tokens
from tokenswift_cli.quality.text import Stretch, degenerate_share
from tokenswift_cli.sampling import capitals, whitespace

TOKENSWIFT = [sys.executable, "-m", "tokenswift_cli"]
PROMPT = (
    "Write a long novel about a lighthouse keeper on a remote island and the people who come and go from it. "
    "Tell it chapter by chapter, in rich and varied prose."
)
WAYS = {
    "prefix": ["--prefix", "prompts/lighthouse-keeper.txt"],
    "prompt": ["--prompt", PROMPT],
}


@dataclass(frozen=True)
class Job:
    way: str
    setting: str
    args: tuple[str, ...]
    seed: int

    @property
    def label(self) -> str:
        return f"{self.way}/{self.setting}/seed{self.seed}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs-dir", type=Path, required=True)
    p.add_argument("--tokens", default="32k")
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--way", choices=sorted(WAYS), nargs="+", default=["prefix"])
    p.add_argument("--setting", action="append", default=[], metavar="NAME=ARGS",
                   help="a named setting: extra `write` options (repeatable; 'defaults=' for none)")  # fmt: skip
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--no-perplexity", action="store_true", help="judge without the judge model (minutes less per run)")
    p.add_argument("--judge-sample", type=int, metavar="N", help="judge NLL on the first N tokens of each bucket only")
    p.add_argument("--bucket", type=int, default=8192, help="tokens per NLL row of the table")
    p.add_argument("--table-only", action="store_true", help="run nothing: tabulate what is judged")
    p.add_argument("--json", type=Path, help="write the table's data here")
    a = p.parse_args()
    settings = [s.split("=", 1) for s in a.setting or ["defaults="]]
    jobs = [
        Job(w, name, tuple(shlex.split(extra)), seed) for w in a.way for name, extra in settings for seed in a.seeds
    ]
    a.runs_dir.mkdir(parents=True, exist_ok=True)
    index_path = a.runs_dir / "screen.json"
    index = json.loads(index_path.read_text()) if index_path.exists() else {}
    for job in jobs:
        if not a.table_only:
            _finish(job, index, index_path, a)
    rows = [_row(job, a.runs_dir / index[job.label]) for job in jobs if job.label in index]
    rows = [r for r in rows if r is not None]
    print(_table(rows))
    if a.json:
        a.json.write_text(json.dumps({"tokens": a.tokens, "rows": rows}, indent=1) + "\n")


def _finish(job: Job, index: dict[str, str], index_path: Path, a: argparse.Namespace) -> None:
    """The job's run, written (or resumed) to its end and judged; the index learns its id as it starts."""
    common = ["--runs-dir", str(a.runs_dir), "--threads", str(a.threads), "--quiet"]
    run = index.get(job.label)
    shown = _show(run, a.runs_dir) if run else {}
    target = (shown.get("statistics") or {}).get("target_tokens", 0)
    # a screen taken further (e.g. 32k, then 100k) raises the run's target
    raise_to = ["--tokens", a.tokens] if run and target < parse_tokens(a.tokens) else []
    if not run:
        cmd = [*TOKENSWIFT, "write", *WAYS[job.way], "--tokens", a.tokens, "--seed", str(job.seed), *job.args]
        before = set(_run_ids(a.runs_dir))
        process = _start([*cmd, *common], job)
        while not (new := set(_run_ids(a.runs_dir)) - before) and process.poll() is None:
            time.sleep(0.5)
        if new:  # recorded before the run ends, so that a stopped screen resumes it
            (run,) = new
            index[job.label] = run
            index_path.write_text(json.dumps(index, indent=1) + "\n")
        if process.wait() != 0:
            raise SystemExit(f"[{job.label}] write failed ({process.returncode})")
    elif shown["state"] != "done" or raise_to:
        if _start([*TOKENSWIFT, "resume", run, *raise_to, *common], job).wait() != 0:
            raise SystemExit(f"[{job.label}] resume of {run} failed")
    assert run is not None
    judged = a.runs_dir / run / "eval.json"
    text = a.runs_dir / run / "text.txt"
    if _needs_judging(judged, text, a):
        cmd = [*TOKENSWIFT, "eval", run, "--runs-dir", str(a.runs_dir), "--bucket", str(a.bucket), "--json"]
        cmd += ["--no-perplexity"] if a.no_perplexity else []
        cmd += ["--sample", str(a.judge_sample)] if a.judge_sample and not a.no_perplexity else []
        # the judge on as many threads as the runs: two screens sharing two cores do not oversubscribe them
        alone = {**os.environ, "OMP_NUM_THREADS": str(a.threads)}
        out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=alone).stdout
        judged.write_text(out)


def _needs_judging(judged: Path, text: Path, a: argparse.Namespace) -> bool:
    """Unjudged, resumed since, or judged without the judge's NLL (or on another sample) when it is asked for."""
    if not judged.exists() or judged.stat().st_mtime < text.stat().st_mtime:
        return True
    if a.no_perplexity:
        return False
    previous = json.loads(judged.read_text())
    return previous.get("nll") is None or previous.get("judge_sample") != a.judge_sample


def _start(cmd: list[str], job: Job) -> subprocess.Popen:
    print(f"[{job.label}] {shlex.join(cmd[2:])}", file=sys.stderr, flush=True)
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL)


def _run_ids(runs_dir: Path) -> list[str]:
    return [d.name for d in runs_dir.glob("run-*") if d.is_dir()]


def _show(run: str, runs_dir: Path) -> dict:
    cmd = [*TOKENSWIFT, "runs", "show", run, "--runs-dir", str(runs_dir), "--json"]
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)


def _row(job: Job, folder: Path) -> dict | None:
    judged = folder / "eval.json"
    if not judged.exists():
        return None
    report = json.loads(judged.read_text())
    stats = _show(folder.name, folder.parent)["statistics"]
    distinct, text = report["distinct"], (folder / "text.txt").read_text(encoding="utf-8")
    return {
        "label": job.label, "run": folder.name, "args": list(job.args), "tokens": report["tokens"],
        "degenerate": _degenerate(report["stretches"]), "stretches": _kinds(report["stretches"]),
        "nll_by_position": [b["nll"] for b in report["buckets"]],
        "distinct": [statistics.fmean(w["distinct"][n] for w in distinct) for n in range(4)],
        "repeated_sentences": report["repeated_sentences"],
        "capitalised_in_a_row": capitals.longest_run(text), "whitespace_in_a_row": whitespace.longest_run(text),
        "tokens_per_second": stats["tokens_per_second"], "tokens_per_step": stats["mean_accepted_length"],
    }  # fmt: skip


def _degenerate(stretches: list[dict]) -> float | None:
    return degenerate_share([Stretch(**s) for s in stretches])


def _kinds(stretches: list[dict]) -> dict[str, int]:
    """How many 500-token stretches there are, how many are degenerate, and of which kind (a stretch can be several)."""
    pieces = [Stretch(**s) for s in stretches]
    return {
        "all": len(pieces), "degenerate": sum(p.degenerate for p in pieces),
        "run together": sum(p.run_together for p in pieces), "list": sum(p.listing for p in pieces),
        "chant": sum(p.chanting for p in pieces), "loop": sum(p.looping for p in pieces),
    }  # fmt: skip


def _degenerate_cell(row: dict) -> str:
    kinds = row.get("stretches")
    if not kinds or row["degenerate"] is None:
        return _share(row["degenerate"])
    named = ", ".join(f"{n} {kind}" for kind, n in kinds.items() if kind not in ("all", "degenerate") and n)
    return f"{row['degenerate']:.0%} ({kinds['degenerate']}/{kinds['all']}{': ' + named if named else ''})"


def _table(rows: list[dict]) -> str:
    lines = [
        "| run | setting | degenerate | judge NLL by position | Distinct-1..4 | repeated | tok/s | tok/step |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        nll = " ".join("-" if x is None else f"{x:.2f}" for x in r["nll_by_position"])
        lines.append(
            f"| {r['run']} | {r['label']} | {_degenerate_cell(r)} | {nll} | "
            f"{' '.join(f'{d:.3f}' for d in r['distinct'])} | {r['repeated_sentences']:.1%} | "
            f"{r['tokens_per_second']:.1f} | {r['tokens_per_step']:.2f} |"
        )
    by_setting: dict[str, list[dict]] = {}
    for r in rows:
        by_setting.setdefault(r["label"].rsplit("/", 1)[0], []).append(r)
    lines += [
        "",
        "| setting | seeds | degenerate (mean) | worst seed | judge NLL (mean of runs) |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, group in by_setting.items():
        shares = [g["degenerate"] or 0.0 for g in group]
        judged = [[x for x in g["nll_by_position"] if x is not None] for g in group]
        nll = statistics.fmean(statistics.fmean(n) for n in judged) if all(judged) else None
        lines.append(
            f"| {name} | {len(group)} | {statistics.fmean(shares):.0%} | {max(shares):.0%} "
            f"| {'-' if nll is None else f'{nll:.2f}'} |"
        )
    return "\n".join(lines)


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


if __name__ == "__main__":
    main()
