"""Continue a run's own text from one of its positions with other sampling settings (plain decoding).

    .venv/bin/python benchmarks/sampling_probe.py RUN_DIR START NEW [--dry 0.8] [--dry-allowed-length 4]
        [--dry-base 1.75] [--penalty 1.05] [--penalty-window 256] [--min-p 0.2] [--temperature 0.8]
        [--seed 1] [--scripts any] [--spacing on] [--dtype float32] [--sinks 192] [--threads 2]

Replays the run's settings (model and weights, sampling, context window) from its settings.json,
keeps its first START generated tokens as the prefix, writes NEW more with the settings changed as
asked (unset flags keep the run's; `--dry 0` and `--penalty 1` turn those off), and prints
measures of the new text: Distinct-4, repeated sentences, compression, the share of characters
outside the prefix's scripts, and per stretch of 500 tokens the mean word length (English prose ~5;
words running together push it past 8) and compression (loops and lists push it past 3): the share
of degenerate stretches (quality.py) and the first of them. `--sinks` changes the context window's
sinks (keep the first N tokens, e.g. the whole prefix, always in view).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import zlib
from pathlib import Path

import torch
from safetensors.torch import load_file

from tokenswift_cli.config import ContextWindow, ModelSpec, RunConfig
from tokenswift_cli.engine.decode import generate_tokens
from tokenswift_cli.model.loading import load_model
from tokenswift_cli.model.target import Target
from tokenswift_cli.quality.text import degenerate_share, distinct_n, repeated_sentence_rate, stretches
from tokenswift_cli.runs.run_model import with_scripts_filter
from tokenswift_cli.sampling import scripts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("start", type=int)
    parser.add_argument("new", type=int)
    parser.add_argument("--dry", type=float, default=None)
    parser.add_argument("--dry-allowed-length", type=int, default=None)
    parser.add_argument("--dry-base", type=float, default=None)
    parser.add_argument("--penalty", type=float, default=None, help="Token penalty (1 = off; default: the run's).")
    parser.add_argument("--penalty-window", type=int, default=None)
    parser.add_argument("--min-p", type=float, default=None)
    parser.add_argument("--temperature", type=float, default=None)
    parser.add_argument("--seed", type=int, default=None, help="Seed of the position-keyed draws (default: the run's).")
    parser.add_argument("--scripts", default=None, help="any, auto or names (default: the run's).")
    parser.add_argument("--spacing", choices=("on", "off"), default=None, help="The spacing rule (default: the run's).")
    parser.add_argument("--dtype", default=None, help="Default: the run's.")
    parser.add_argument("--sinks", type=int, default=None, help="Sinks of the context window (default: the run's).")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None, help="Also write the JSON result here.")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    settings = json.loads((args.run / "settings.json").read_text())
    cfg = RunConfig.from_dict(settings["run_config"])
    manifest = json.loads((args.run / "checkpoint" / "manifest.json").read_text())
    state_file = next(f["name"] for f in manifest["files"] if f["kind"] == "state")
    tokens = load_file(args.run / "checkpoint" / state_file)["tokens"].tolist()
    prefix_length = manifest["state"]["prefix_length"]
    prompt = tokens[: prefix_length + args.start]
    spec = ModelSpec(**settings["model"]["spec"])
    if args.dtype:
        spec = dataclasses.replace(spec, dtype=args.dtype)
    loaded = load_model(spec)
    # Flags named like their SamplingConfig field; --dry, --penalty and --scripts translate below.
    same_name = ("dry_allowed_length", "dry_base", "penalty_window", "min_p", "temperature", "seed")
    changes: dict[str, object] = {k: getattr(args, k) for k in same_name if getattr(args, k) is not None}
    if args.dry is not None:
        changes["dry_multiplier"] = args.dry or None
    if args.penalty is not None:
        changes["penalty"] = None if args.penalty == 1.0 else args.penalty
    if args.scripts is not None:
        changes["scripts"] = scripts.parse_scripts(args.scripts)
    if args.spacing is not None:
        changes["spacing"] = args.spacing == "on"
    sampling = dataclasses.replace(cfg.sampling, **changes)  # type: ignore[arg-type]
    prefix_text = loaded.tokenizer.decode(tokens[:prefix_length])
    sampling = with_scripts_filter(sampling, loaded.tokenizer, loaded.model.config.vocab_size, prefix=prefix_text)
    run = cfg.replace(max_new_tokens=args.new, mode="plain", sampling=sampling)
    if args.sinks is not None:
        if not isinstance(cfg.window, ContextWindow):
            raise SystemExit("--sinks needs a run with a context window")
        run = run.replace(window=ContextWindow(size=cfg.window.size, sinks=args.sinks))
    out, _ = generate_tokens(Target(loaded.model), None, prompt, run)
    text = loaded.tokenizer.decode(out)
    pieces = stretches(out, loaded.tokenizer)
    alphabet = scripts.Alphabet(scripts.scripts_of(prefix_text))
    result = {
        "run": str(args.run), "start": args.start, "new": args.new, "weights": spec.weights,
        "sampling": {k: v for k, v in sampling.to_dict().items() if k != "suppress_token_ids"},
        "distinct_4": round(distinct_n(out, 4), 3), "repeated_sentences": round(repeated_sentence_rate(text), 3),
        "compression": round(len(text.encode()) / max(1, len(zlib.compress(text.encode()))), 2),
        "foreign_chars": round(alphabet.foreign_share(text), 3),
        "degenerate": degenerate_share(pieces),
        "word_length_per_500": [round(p.word_length, 1) for p in pieces],
        "compression_per_500": [round(p.compression, 2) for p in pieces],
        "words_per_line_per_500": [round(p.words_per_line, 1) for p in pieces],
        "sinks": run.window.sinks if isinstance(run.window, ContextWindow) else None,
        "first_degenerate": next((args.start + p.start for p in pieces if p.degenerate), None),
        "start_text": text[:300], "end_text": text[-300:],
    }  # fmt: skip
    print(json.dumps(result, ensure_ascii=False, indent=1))
    if args.out:  # with the whole text
        args.out.write_text(json.dumps({**result, "text": text}, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
