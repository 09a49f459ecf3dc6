"""Held-out NLL of a bfloat16 model with its linear layers through torch's BLAS and through the row-exact
dense products (`backends/cpu/dense.py`), float32 beside them: what the new arithmetic costs in quality.

Scores the first --tokens tokens of each file in windows of --window tokens (each from position 0), the
embedded model with dense weights, and prints the mean NLL per token each way.

    python benchmarks/dense_perplexity.py src/tokenswift_cli/data/texts/*.txt --tokens 4096 --window 1024
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from tokenswift_cli.backends.cpu import dense
from tokenswift_cli.config import ModelSpec
from tokenswift_cli.model.loading import load_model


def nll(model: torch.nn.Module, ids: torch.Tensor, window: int) -> float:
    total, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(ids) - 1, window):
            part = ids[start : start + window + 1]
            logits = model(part[None, :-1]).logits[0].float()
            total += torch.nn.functional.cross_entropy(logits, part[1:], reduction="sum").item()
            count += len(part) - 1
    return total / count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--window", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load_model(ModelSpec(weights="dense"))
    model, tokenizer = loaded.model.eval(), loaded.tokenizer
    assert tokenizer is not None
    rows = []
    for path in args.files:
        ids = tokenizer(path.read_text(encoding="utf-8"), return_tensors="pt").input_ids[0][: args.tokens]
        row = {"file": path.name, "tokens": len(ids), "float32": nll(model.float(), ids, args.window)}
        row["bfloat16, BLAS"] = nll(model.to(torch.bfloat16), ids, args.window)
        linears = [m for m in model.modules() if type(m) is torch.nn.Linear]
        for m in linears:  # every linear layer and the head through the row-exact products
            m.forward = lambda x, m=m: dense.linear(x, m.weight, m.bias)  # type: ignore[method-assign]
        row["bfloat16, dense.py"] = nll(model, ids, args.window)
        for m in linears:
            del m.forward
        rows.append(row)
        print(json.dumps(row))
    if args.json:
        args.json.write_text(json.dumps({"window": args.window, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
