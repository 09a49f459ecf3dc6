"""Held-out NLL of a GGUF file on its own blocks (`--weights gguf`) against its float32 de-quantised copy
(`--weights dense`): the 8-bit activations' cost, issue 56 item 6.

    python benchmarks/gguf_perplexity.py MODEL.gguf TEXT [TEXT ...] --tokens 1024 --window 1024 --json OUT
"""

from __future__ import annotations

import argparse
import gc
import json
import math
from pathlib import Path

import torch

from tokenswift_cli.config import ModelSpec
from tokenswift_cli.model.loading import load_model


def nll(model: torch.nn.Module, ids: torch.Tensor, window: int) -> float:
    total, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, ids.numel() - 1, window):
            chunk = ids[start : start + window + 1]
            logits = model(chunk[None, :-1]).logits[0].float()
            total += torch.nn.functional.cross_entropy(logits, chunk[1:], reduction="sum").item()
            count += chunk.numel() - 1
    return total / count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--window", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    results: dict[str, dict[str, float]] = {}
    for weights in ("gguf", "dense"):
        loaded = load_model(ModelSpec(name=str(args.model), weights=weights))  # type: ignore[arg-type]
        assert loaded.tokenizer is not None
        for path in args.files:
            ids = torch.tensor(loaded.tokenizer(path.read_text(encoding="utf-8")).input_ids[: args.tokens + 1])
            results.setdefault(path.name, {})[weights] = nll(loaded.model, ids, args.window)
        del loaded
        gc.collect()
    print(f"{'text':<40} {'gguf NLL':>9} {'dense NLL':>9} {'ppl ratio':>9}")
    for name, r in results.items():
        print(f"{name:<40} {r['gguf']:9.4f} {r['dense']:9.4f} {math.exp(r['gguf'] - r['dense']):9.4f}")
    if args.json:
        args.json.write_text(
            json.dumps({"model": str(args.model), "tokens": args.tokens, "results": results}, indent=1)
        )


if __name__ == "__main__":
    main()
