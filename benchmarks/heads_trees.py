"""Tokens per step of tree templates at the paper's sampling, with and without heads (replayed).

The model writes 512 tokens after the first 1,024 / 2,048 / 3,072 tokens of the held-out text
(seed 0); `train/acceptance.replay` walks each text with every tree template, walked and over every
root, beside the oracle of the same shape. One JSON list of rows is written to --out.

    python benchmarks/heads_trees.py --heads default --out results/heads/issue34-trees-paper-sampling.json
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

import torch

from tokenswift_cli.config import DraftConfig, ModelSpec
from tokenswift_cli.data import HELD_OUT_TEXT
from tokenswift_cli.model.heads import resolve_heads
from tokenswift_cli.model.loading import end_of_text_ids, load_model
from tokenswift_cli.sampling.defaults import PAPER
from tokenswift_cli.train.acceptance import replay, write_text

TREES = ((1, 3, 3, 3), (2, 3, 3, 3), (3, 3, 3, 3), (3, 2, 2, 2))
SHOWN = ("prefix", "tree", "heads", "no_heads", "oracle", "heads_every_root", "no_heads_every_root")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heads", default="default", help="heads file, or default")
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load_model(ModelSpec(name="default", weights="dense", dtype="float32"), attn_implementation="sdpa")
    assert loaded.tokenizer is not None
    heads, _ = resolve_heads(args.heads, loaded)
    sampling = replace(PAPER, seed=0, suppress_token_ids=tuple(end_of_text_ids(loaded)))
    rows = []
    for prefix in (1024, 2048, 3072):
        prompt = loaded.tokenizer(HELD_OUT_TEXT.read_text())["input_ids"][:prefix]
        tokens = write_text(loaded.model, prompt, 512, sampling)
        for tree in TREES:
            result = replay(loaded.model, heads, tokens, prefix, sampling=sampling, draft=DraftConfig(tree=tree))
            rows.append({"prefix": prefix, "tree": tree, **result.to_dict()})
            print(json.dumps({k: rows[-1][k] for k in SHOWN}), flush=True)
    with open(args.out, "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
