"""Acceptance and speed of TokenSwift with the shipped heads vs without heads (and plain decoding).

Runs `decode.generate` on the default model for each prefix file and setting, the modes
interleaved in one process. Speed is reported both per wall-clock second and per CPU second of
this process (one thread): on a shared, overloaded machine only the latter compares runs fairly.
Prints one JSON line per run and a summary table.

    .venv/bin/python heads/benchmark.py --prefix-tokens 1024 --tokens 500 \
        src/tokenswift_cli/data/texts/*.txt
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from tokenswift_cli.config import ModelSpec, RunConfig, SamplingConfig
from tokenswift_cli.engine.decode import generate
from tokenswift_cli.engine.state import prefill
from tokenswift_cli.model.heads import resolve_heads
from tokenswift_cli.model.loading import load_model
from tokenswift_cli.model.target import Target

SETTINGS = {
    "greedy": SamplingConfig(),
    "t1-minp0.1-pen1.2": SamplingConfig(temperature=1.0, min_p=0.1, penalty=1.2),
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("prefixes", nargs="+", type=Path)
    parser.add_argument("--prefix-tokens", type=int, default=1024)
    parser.add_argument("--tokens", type=int, default=500)
    parser.add_argument("--heads", default="default")
    parser.add_argument("--modes", default="heads,none,plain")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load_model(ModelSpec())
    heads, path = resolve_heads(args.heads, loaded)
    print(f"heads: {path}", file=sys.stderr)
    target = Target(loaded.model)
    assert loaded.tokenizer is not None
    results: dict[tuple[str, str], list[dict[str, float]]] = {}
    for prefix in args.prefixes:
        prompt = loaded.tokenizer(prefix.read_text(encoding="utf-8"))["input_ids"][: args.prefix_tokens]
        for name, sampling in SETTINGS.items():
            outputs = {}
            for mode in args.modes.split(","):
                cfg = RunConfig(max_new_tokens=args.tokens, sampling=sampling,
                                mode="plain" if mode == "plain" else "tokenswift")  # fmt: skip
                state = prefill(target, prompt, cfg)
                cpu, wall = time.process_time(), time.perf_counter()
                events = generate(target, heads if mode == "heads" else None, state, cfg)
                tokens = [t for event in events for t in event.tokens]
                cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
                outputs[mode] = tokens
                stats = state.stats
                row = {"alpha": stats.alpha, "mean_accepted": stats.mean_accepted,
                       "tokens_per_second": len(tokens) / wall, "tokens_per_cpu_second": len(tokens) / cpu}  # fmt: skip
                results.setdefault((name, mode), []).append(row)
                print(json.dumps({"prefix": prefix.name, "setting": name, "mode": mode, **row}), flush=True)
            same = len({tuple(t) for t in outputs.values()}) == 1
            print(json.dumps({"prefix": prefix.name, "setting": name, "identical_outputs": same}), flush=True)
    print("\n| setting | mode | alpha | mean accepted | tokens/s | tokens/CPU-s |")
    print("| --- | --- | --- | --- | --- | --- |")
    for (name, mode), rows in results.items():
        m = {k: statistics.mean(r[k] for r in rows) for k in rows[0]}
        print(f"| {name} | {mode} | {m['alpha']:.3f} | {m['mean_accepted']:.2f} | {m['tokens_per_second']:.1f} "
              f"| {m['tokens_per_cpu_second']:.1f} |")  # fmt: skip


if __name__ == "__main__":
    main()
