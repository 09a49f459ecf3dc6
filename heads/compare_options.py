"""The training options side by side on held-out text: soft vs hard targets, chained vs parallel heads.

One set of rows (self-written text, plus two of the package's texts read teacher-forced), each option
trained on it for the same steps, then measured as `heads eval` measures: per-head top-1/top-3
against the model's own next tokens on the held-out text (`data.HELD_OUT_TEXT`), and tokens per
step of the paper's tree at the paper's sampling on one text the model writes after its prefix
(the same text for every option, the shipped heads and no heads).

    nice .venv/bin/python heads/compare_options.py --samples 32 --sample-tokens 256 --steps 600 --threads 1
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace

import torch

from tokenswift_cli.config import ModelSpec
from tokenswift_cli.data import HELD_OUT_TEXT, TEXTS
from tokenswift_cli.model.heads import resolve_heads
from tokenswift_cli.model.loading import end_of_text_ids, load_model
from tokenswift_cli.sampling.defaults import PAPER
from tokenswift_cli.train.acceptance import replay, write_text
from tokenswift_cli.train.data import Rows
from tokenswift_cli.train.fit import TrainConfig, lm_head_weight, train_heads
from tokenswift_cli.train.run import DataConfig, distilled_rows, file_rows, held_out_accuracy, new_heads

OPTIONS = {"soft, chained": ("soft", True), "hard, chained": ("hard", True), "soft, parallel": ("soft", False)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=32)
    parser.add_argument("--sample-tokens", type=int, default=256)
    parser.add_argument("--file-tokens", type=int, default=4096, help="tokens of each training text read")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--prefix-tokens", type=int, default=1024)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    began = time.monotonic()
    loaded = load_model(ModelSpec(weights="dense", dtype="float32"), attn_implementation="sdpa")
    assert loaded.tokenizer is not None
    data = DataConfig(samples=args.samples, sample_tokens=args.sample_tokens, long_windows=0, held_out_samples=0)
    written, _ = distilled_rows(loaded, data, heads=3)
    files = [str(TEXTS / name) for name in ("britannica-shakespeare-biography.txt", "shakespeare-othello.txt")]
    read = file_rows(loaded, files, window=args.file_tokens, heads=3, limit=args.file_tokens)
    rows = Rows.concat([written, read])
    print(json.dumps({"rows": rows.size, "written": written.size, "read": read.size,
                      "data_seconds": round(time.monotonic() - began)}), flush=True)  # fmt: skip
    held_out = {"held-out": file_rows(loaded, [str(HELD_OUT_TEXT)], window=4096, heads=3, limit=4096)}
    sampling = replace(PAPER, suppress_token_ids=tuple(end_of_text_ids(loaded)))
    prompt = loaded.tokenizer(HELD_OUT_TEXT.read_text(encoding="utf-8"))["input_ids"][: args.prefix_tokens]
    text = write_text(loaded.model, prompt, args.new_tokens, sampling)
    candidates = {"shipped": resolve_heads("default", loaded)[0]}
    for name, (target, chained) in OPTIONS.items():
        heads = new_heads(loaded, 3, rows, chained=chained)
        cfg = TrainConfig(target=target, chained=chained, steps=args.steps, warmup=min(100, args.steps // 10))  # type: ignore[arg-type]
        started = time.monotonic()
        train_heads(heads, lm_head_weight(loaded.model), rows, cfg)
        print(json.dumps({"option": name, "train_seconds": round(time.monotonic() - started)}), flush=True)
        candidates[name] = heads
    for name, heads in candidates.items():
        assert heads is not None
        accuracy = {k: v.model_top1 + v.model_top3 for k, v in held_out_accuracy(heads, loaded, held_out).items()}
        result = replay(loaded.model, heads, text, len(prompt), sampling=sampling)
        print(json.dumps({"option": name, "model_top1_top3": {k: [round(x, 3) for x in v] for k, v in accuracy.items()},
                          **result.to_dict()}), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
