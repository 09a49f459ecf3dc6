"""Continue a run's own text from one of its positions, DRY on or off (plain decoding): loops or not?

    .venv/bin/python benchmarks/dry_probe.py RUN_DIR START NEW [--dry 0.8] [--penalty 1.05] [--dtype bfloat16]

Replays the run's settings (sampling, context window, rope) from its settings.json, keeps its first
START generated tokens as the prefix, writes NEW more, and prints repetition measures of them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import zlib
from pathlib import Path

import torch
from safetensors.torch import load_file

from tokenswift_cli.config import ModelSpec, RunConfig
from tokenswift_cli.decode import generate_tokens
from tokenswift_cli.loading import load_model
from tokenswift_cli.quality import distinct_n, repeated_sentence_rate
from tokenswift_cli.target import Target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("start", type=int)
    parser.add_argument("new", type=int)
    parser.add_argument("--dry", type=float, default=None)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--penalty", type=float, default=None, help="Token penalty (1 = off; default: the run's).")
    args = parser.parse_args()
    torch.set_num_threads(1)
    settings = json.loads((args.run / "settings.json").read_text())
    cfg = RunConfig.from_dict(settings["run_config"])
    manifest = json.loads((args.run / "checkpoint" / "manifest.json").read_text())
    state_file = next(f["name"] for f in manifest["files"] if f["kind"] == "state")
    tokens = load_file(args.run / "checkpoint" / state_file)["tokens"].tolist()
    prompt = tokens[: manifest["state"]["prefix_length"] + args.start]
    spec = dataclasses.replace(ModelSpec(**settings["model"]["spec"]), dtype=args.dtype)
    loaded = load_model(spec)
    sampling = dataclasses.replace(cfg.sampling, dry_multiplier=args.dry)
    if args.penalty is not None:
        sampling = dataclasses.replace(sampling, penalty=None if args.penalty == 1.0 else args.penalty)
    run = cfg.replace(max_new_tokens=args.new, mode="plain", sampling=sampling)
    out, _ = generate_tokens(Target(loaded.model), None, prompt, run)
    text = loaded.tokenizer.decode(out)
    wide = sum(1 for ch in text if 0xFF00 <= ord(ch) <= 0xFFEF) / max(1, len(text))
    print(json.dumps({
        "dry": args.dry, "penalty": sampling.penalty, "start": args.start, "new": args.new,
        "distinct_4": round(distinct_n(out, 4), 3),
        "repeated_sentences": round(repeated_sentence_rate(text), 3), "full_width_chars": round(wide, 3),
        "compression": round(len(text.encode()) / max(1, len(zlib.compress(text.encode()))), 2),
        "start_text": text[:300], "end_text": text[-300:],
    }, ensure_ascii=False, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
