"""Generate long texts with candidate sampling settings, for benchmarks/record/quality.md (issue 6).

Writes OUT.tokens (one token id per line, appended as they are committed, so a run can be read
while it goes on), OUT.json (settings) and, at the end, OUT.txt. Example:

    .venv/bin/python benchmarks/quality_runs.py --out runs/p12 --tokens 8192 --penalty 1.2 --min-p 0.1
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from tokenswift_cli.config import ModelSpec, RunConfig, SamplingConfig
from tokenswift_cli.engine.decode import generate
from tokenswift_cli.engine.state import prefill
from tokenswift_cli.model.loading import eos_token_ids, load_model
from tokenswift_cli.model.target import Target


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--prompt", default="prompts/lighthouse-keeper.txt")
    p.add_argument("--prefix-tokens", type=int, default=None, help="keep only the prompt's first N tokens")
    p.add_argument("--tokens", type=int, default=8192)
    p.add_argument("--penalty", type=float, default=1.2)
    p.add_argument("--window", type=int, default=1024)
    p.add_argument("--min-p", type=float, default=0.1)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--rope", default="auto", choices=["auto", "yarn", "none"])
    p.add_argument("--rope-factor", type=float, default=None)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--mode", default="plain", choices=["plain", "tokenswift"])
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    text = Path(a.prompt).read_text(encoding="utf-8")
    spec = ModelSpec(dtype=a.dtype, rope_scaling=a.rope, rope_factor=a.rope_factor)
    probe = load_model(ModelSpec())
    assert probe.tokenizer is not None
    prompt = probe.tokenizer(text)["input_ids"][: a.prefix_tokens]
    loaded = load_model(spec, total_tokens=len(prompt) + a.tokens)
    eos = eos_token_ids(loaded.tokenizer, loaded.model)
    sampling = SamplingConfig(
        temperature=a.temperature, min_p=a.min_p or None, penalty=a.penalty or None,
        penalty_window=a.window, seed=a.seed, suppress_token_ids=tuple(eos),
    )  # fmt: skip
    cfg = RunConfig(max_new_tokens=a.tokens, mode=a.mode, sampling=sampling)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    settings = {"run": cfg.to_dict(), "model": loaded.spec.__dict__, "prompt": a.prompt, "prompt_tokens": len(prompt)}
    _file(out, ".json").write_text(json.dumps(settings, indent=1) + "\n")
    target = Target(loaded.model)
    start, generated = time.time(), []
    state = prefill(target, prompt, cfg)
    with _file(out, ".tokens").open("w") as f:
        for event in generate(target, None, state, cfg, eos_ids=eos):
            generated += event.tokens
            f.write("".join(f"{t}\n" for t in event.tokens))
            f.flush()
    settings["seconds"] = round(time.time() - start, 1)
    _file(out, ".json").write_text(json.dumps(settings, indent=1) + "\n")
    _file(out, ".txt").write_text(loaded.tokenizer.decode(generated), encoding="utf-8")


def _file(out: Path, suffix: str) -> Path:
    return out.parent / (out.name + suffix)  # not with_suffix: "p1.1" is a name, not a suffix


if __name__ == "__main__":
    main()
