"""Held-out NLL through the engine's own logits on a CPU: the 4-bit decoder, then the float32 head and
the Q8_0 head, side by side (`tokenswift eval` scores `transformers`' head, not the engine's).

Scores the first --tokens tokens of each file in windows of --window tokens (each from position 0) and
prints the mean NLL per token through each head and the ratio of their perplexities. Run it with the
code before and after a change of the products (e.g. PYTHONPATH=/path/to/old/src) to compare both.

    python benchmarks/logits_perplexity.py FILE [FILE ...] --tokens 8192 --window 2048
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch

from tokenswift_cli.backends.cpu.q8_head import Q8Head
from tokenswift_cli.config import ModelSpec
from tokenswift_cli.model.loading import load_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--window", type=int, default=2048)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load_model(ModelSpec(weights="int4"))
    model, tokenizer = loaded.model, loaded.tokenizer
    assert tokenizer is not None
    head = Q8Head.from_weight(model.get_output_embeddings().weight)
    assert head is not None, "the model's head is not a Q8_0 tensor"
    for path in args.files:
        ids = tokenizer(path.read_text(encoding="utf-8"), return_tensors="pt").input_ids[0][: args.tokens]
        totals, count = {"float32 head": 0.0, "Q8_0 head": 0.0}, 0
        for start in range(0, len(ids) - 1, args.window):
            window = ids[start : start + args.window]
            with torch.no_grad():
                hidden = model.model(window[None]).last_hidden_state[0]
                for name, logits in (("float32 head", model.lm_head(hidden)), ("Q8_0 head", head.logits(hidden))):
                    nll = torch.nn.functional.cross_entropy(logits[:-1].float(), window[1:], reduction="sum")
                    totals[name] += nll.item()
            count += len(window) - 1
        means = {name: total / count for name, total in totals.items()}
        ratio = math.exp(means["Q8_0 head"] - means["float32 head"])
        print(f"{path}: {count} tokens, NLL " + ", ".join(f"{k} {v:.5f}" for k, v in means.items()) +
              f"; perplexity Q8_0 / float32 {ratio:.5f}")  # fmt: skip


if __name__ == "__main__":
    main()
