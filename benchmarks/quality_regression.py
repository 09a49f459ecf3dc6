"""Short seeded runs of the embedded model, measured as tests/test_quality_regression.py asserts them (issue 43).

`short_run` writes as `tokenswift write` does with every flag left unset (the embedded model's measured
sampling, `--scripts auto`, end-of-text suppressed, the whole request kept with `--prompt`), in process
and in plain mode (the same text as TokenSwift's), so that one model load serves every run; settings
given as keyword arguments override the defaults as the flags would. `measure` gives what the test
asserts: the 500-token stretches of `quality.text` (degenerate share, and of which kind), the words of
more than `LONG_WORD` letters (words run together), and per measure the worst stretch, to show the margin.

Calibration (docs/quality.md, "Regression check on CI"): one line per run and cut, the extremes per
setting; `--cut N` measures the first N tokens of each run too, `--jobs 2` runs two processes of one
thread each (a 2-core machine's cores), `--json` keeps the rows (token ids and texts included):

    nice -n 10 .venv/bin/python benchmarks/quality_regression.py --tokens 1500 --cut 1000 \\
        --seeds 0 1 2 3 4 5 6 7 8 9 --setting defaults= --jobs 2 --json /tmp/regression-defaults.json
    nice -n 10 .venv/bin/python benchmarks/quality_regression.py --tokens 1000 --cut 500 \\
        --seeds 0 1 2 3 4 5 6 7 8 9 --setting loops=temperature=1.0,penalty=1.0,dry_multiplier=none \\
        --setting run-together=penalty=2.0 --jobs 2 --json /tmp/regression-bad.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PREFIX = ROOT / "prompts" / "lighthouse-keeper.txt"
# quality_screen.PROMPT: the request the screens answer
REQUEST = (
    "Write a long novel about a lighthouse keeper on a remote island and the people who come and go from it. "
    "Tell it chapter by chapter, in rich and varied prose."
)
WAYS = ("prefix", "prompt")
LONG_WORD = 15  # letters in a row; more are rare in prose (see `book_long_words`)
_LETTERS = re.compile(r"[^\W\d_]+")


def load() -> Any:
    """The embedded model as `write` loads it (4-bit weights on a CPU), without draft heads."""
    from tokenswift_cli.config import ModelSpec, RunConfig
    from tokenswift_cli.runs.run_model import load_run_model, unscaled

    return load_run_model(unscaled(ModelSpec()), None, RunConfig(max_new_tokens=1, mode="plain"), lambda _: None)


def short_run(loaded: Any, way: str, seed: int, tokens: int, **overrides: Any) -> list[int]:
    """The first `tokens` tokens `tokenswift write --prefix prompts/lighthouse-keeper.txt` (way "prefix") or
    `write --prompt REQUEST` (way "prompt") writes with `--seed seed` and every other flag unset, but for
    `overrides` (SamplingConfig fields, e.g. temperature=1.0, dry_multiplier=None)."""
    from tokenswift_cli.cli.write import sampling_for
    from tokenswift_cli.config import DEFAULT_SINKS, ModelSpec, RunConfig
    from tokenswift_cli.engine.decode import generate_tokens
    from tokenswift_cli.model.chat import ChatRequest, prompt_tokens
    from tokenswift_cli.parsing import parse_window
    from tokenswift_cli.runs.run_model import bind_scripts, fit_kv_cache, fit_window, suppress_eos

    request = ChatRequest(REQUEST) if way == "prompt" else None
    prefix = request.render(loaded.tokenizer) if request is not None else PREFIX.read_text()
    prompt = prompt_tokens(loaded.tokenizer, prefix, templated=request is not None)
    sampling = dataclasses.replace(sampling_for("default", seed=seed), **overrides)
    window = parse_window("auto", "prompt" if request is not None else DEFAULT_SINKS)
    config = RunConfig(max_new_tokens=tokens, mode="plain", sampling=sampling, window=window)
    config = fit_kv_cache(fit_window(config, ModelSpec(), loaded.target, len(prompt)), loaded.target)
    config = bind_scripts(suppress_eos(config, loaded.eos_ids), loaded, prefix)
    out, _ = generate_tokens(loaded.target, None, prompt, config, eos_ids=loaded.eos_ids)
    return out


def long_words(text: str, letters: int = LONG_WORD) -> list[str]:
    """Runs of more than `letters` letters: words run together ("foundalotoveramagtunedbymorales...")."""
    return [w for w in _LETTERS.findall(text) if len(w) > letters]


def measure(tokens: Sequence[int], tokenizer: Any) -> dict[str, Any]:
    """The stretches' verdicts, the long words, and the worst stretch per measure."""
    from tokenswift_cli.quality.text import degenerate_share, stretches

    found = stretches(tokens, tokenizer)
    text = str(tokenizer.decode(list(tokens)))
    return {
        "tokens": len(tokens),
        "stretches": len(found),
        "degenerate": sum(s.degenerate for s in found),
        "share": degenerate_share(found),
        "kinds": {
            "run together": sum(s.run_together for s in found),
            "list": sum(s.listing for s in found),
            "chant": sum(s.chanting for s in found),
            "loop": sum(s.looping for s in found),
        },  # fmt: skip
        "long_words": long_words(text),
        "max_word_length": max((s.word_length for s in found), default=0.0),
        "max_compression": max((s.compression for s in found), default=0.0),
        "min_words_per_line": min((s.words_per_line for s in found), default=float("inf")),
        "max_chant": max((s.chant for s in found), default=0.0),
        "text": text,
    }


def book_long_words(letters: int = LONG_WORD) -> dict[str, int]:
    """The longest run of letters in each public-domain book the benchmarks use, and how many pass `letters`."""
    folder = ROOT / "src" / "tokenswift_cli" / "data" / "texts"
    found = {}
    for book in sorted(folder.glob("*.txt")):
        text = book.read_text()
        found[book.name] = max(map(len, _LETTERS.findall(text)))
        found[book.name + f" >{letters}"] = len(long_words(text, letters))
    return found


def _parse_setting(text: str) -> tuple[str, dict[str, Any]]:
    """NAME=field=value,field=value (SamplingConfig fields; "none" = off), e.g. nodry=dry_multiplier=none."""
    name, _, rest = text.partition("=")
    overrides: dict[str, Any] = {}
    for part in filter(None, rest.split(",")):
        field, _, value = part.partition("=")
        overrides[field] = None if value == "none" else float(value) if "." in value else int(value)
    return name, overrides


def _line(row: dict[str, Any]) -> str:
    kinds = ", ".join(f"{n} {k}" for k, n in row["kinds"].items() if n)
    return (
        f"{row['setting']:>10} {row['way']:>6} seed {row['seed']:>2}: {row['degenerate']}/{row['stretches']} "
        f"degenerate{' (' + kinds + ')' if kinds else ''}, {len(row['long_words'])} long words, worst stretch: "
        f"word length {row['max_word_length']:.2f}, compression {row['max_compression']:.2f}, "
        f"words/line {row['min_words_per_line']:.1f}, chant {row['max_chant']:.2f} ({row['seconds']:.0f} s)"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, default=1000)
    p.add_argument("--cut", type=int, nargs="+", help="also measure the first N tokens of each run")
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--way", choices=WAYS, nargs="+", default=list(WAYS))
    p.add_argument("--setting", action="append", default=[], metavar="NAME=FIELD=VALUE,...",
                   help="overrides of the defaults: SamplingConfig fields, 'none' = off ('defaults=')")  # fmt: skip
    p.add_argument("--jobs", type=int, default=1, help="processes of one thread each")
    p.add_argument("--json", type=Path, help="write the rows here")
    p.add_argument("--texts", action="store_true", help="print each text's last 300 characters")
    p.add_argument("--worker", nargs=2, metavar=("JOBS", "CUTS"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        _work([tuple(job) for job in json.loads(a.worker[0])], json.loads(a.worker[1]))
        return
    jobs = [(s, w, seed) for s in a.setting or ["defaults="] for w in a.way for seed in a.seeds]
    cuts = sorted({*(a.cut or ()), a.tokens})
    rows = _run_jobs(jobs, cuts, a.jobs)
    for cut in cuts:
        print(f"\n## first {cut} tokens\n")
        at = [r for r in rows if r["tokens"] == cut]
        for row in at:
            print(_line(row))
            if a.texts and cut == a.tokens:
                print("   ..." + row["text"][-300:].replace("\n", " | "))
        print()
        for name in dict.fromkeys(row["setting"] for row in at):
            print(_summary(name, [r for r in at if r["setting"] == name]))
    print("\nbooks:", book_long_words())
    if a.json:
        a.json.write_text(json.dumps({"tokens": a.tokens, "rows": rows}, indent=1) + "\n")


def _summary(name: str, group: list[dict[str, Any]]) -> str:
    shares = [r["share"] or 0.0 for r in group]
    return (
        f"{name}: {len(group)} runs, degenerate {sum(r['degenerate'] for r in group)}/"
        f"{sum(r['stretches'] for r in group)} (worst run {max(shares):.0%}), long words worst "
        f"{max(len(r['long_words']) for r in group)}, worst stretch: word length "
        f"{max(r['max_word_length'] for r in group):.2f}, compression {max(r['max_compression'] for r in group):.2f}, "
        f"words/line {min(r['min_words_per_line'] for r in group):.1f}, chant {max(r['max_chant'] for r in group):.2f}"
    )


def _work(jobs: list[tuple[str, str, int]], cuts: list[int]) -> None:
    """Run `jobs` on one model load, one thread; a JSON line per run and cut on stdout."""
    import torch

    torch.set_num_threads(1)
    loaded = load()
    for setting, way, seed in jobs:
        name, overrides = _parse_setting(setting)
        started = time.perf_counter()
        out = short_run(loaded, way, seed, max(cuts), **overrides)
        seconds = time.perf_counter() - started
        for cut in cuts:
            row = {"setting": name, "way": way, "seed": seed, "overrides": overrides, "seconds": seconds}
            row |= measure(out[:cut], loaded.tokenizer)
            print(json.dumps({**row, "ids": out[:cut]}), flush=True)


def _run_jobs(jobs: list[tuple[str, str, int]], cuts: list[int], parallel: int) -> list[dict[str, Any]]:
    """The jobs shared out among `parallel` processes of one thread each (one model load each)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    worker = [sys.executable, __file__, "--worker"]
    with tempfile.TemporaryDirectory() as folder:
        outs = [Path(folder, f"{i}.jsonl") for i in range(parallel)]
        processes = [
            subprocess.Popen([*worker, json.dumps(jobs[i::parallel]), json.dumps(cuts)], stdout=out.open("w"), env=env)
            for i, out in enumerate(outs)
            if jobs[i::parallel]
        ]
        if any(process.wait() != 0 for process in processes):
            raise SystemExit("a worker failed")
        rows = [json.loads(line) for out in outs if out.exists() for line in out.read_text().splitlines()]
    order = {(s.partition("=")[0], w, seed): i for i, (s, w, seed) in enumerate(jobs)}
    return sorted(rows, key=lambda r: (r["tokens"], order[(r["setting"], r["way"], r["seed"])]))


if __name__ == "__main__":
    main()
