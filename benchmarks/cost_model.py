"""Predict TokenSwift's speedup on an 8B model from measured costs and measured acceptance, beside the paper's 3x.

    python benchmarks/cost_model.py                                       # CPU acceptance + an ASSUMED GPU curve
    python benchmarks/cost_model.py --shapes shapes.json --gpu bench-nvidia-h100-80gb-hbm3.json   # measured

An iteration commits `mean_accepted` tokens (measured with the embedded model: benchmarks/results/drafts/*.json,
or the GPU bench when given) and costs one verification of the tree, a draft pass (the paper's drafting
runs the model once more; `--draft-steps`), both in plain steps (the host's share is reported, not modelled):

    speedup = mean_accepted / (verify(nodes) / step + draft_steps)

`verify(nodes) / step` comes from gpu_shapes.py's 8B row when given (`verify64_over_step`); else from
an assumed curve, 1 + 0.004 per node (H100 bf16: a 64-row product adds ~1 TFLOP ~ 1.3 ms to a ~5 ms
weight read: GPU-NOTES.md), labelled "assumed" in the output. Nothing here is a measurement of an 8B model.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CPU_BENCHES = {
    "greedy": HERE / "results/drafts/greedy-full-context-8k-32k-1024tokens-2threads.json",
    "paper": HERE / "results/drafts/sampled-paper-window4k-2k-8k-2threads.json",
}
PAPER_SPEEDUP = 3.0  # TokenSwift paper: Llama-3.1-8B, 100K tokens
ASSUMED_PER_NODE = 0.004


def acceptance(path: Path) -> list[float]:
    """Tokens committed per iteration of every TokenSwift result in a bench JSON."""
    document = json.loads(path.read_text(encoding="utf-8"))
    return [r["mean_accepted"] for r in document["results"] if r["method"] == "tokenswift" and r["mean_accepted"]]


def verify_cost(shapes: Path | None, nodes: int) -> tuple[float, float, str]:
    """(verification / plain step, host share) for the 8B shape, and where they came from."""
    if shapes is not None:
        document = json.loads(shapes.read_text(encoding="utf-8"))
        row = next(r for r in document["shapes"] if r["shape"] == "llama-3.1-8b")
        context = next(v for k, v in row.items() if k.startswith("ctx"))
        measured = context["verify64_over_step"]
        return 1 + (measured - 1) * nodes / 64, context["host_share"], f"measured on {document.get('gpu', '?')}"
    return 1 + ASSUMED_PER_NODE * nodes, 0.0, "ASSUMED (no GPU measurement given)"


def predict(accepted: float, verify: float, draft_steps: float) -> float:
    return accepted / (verify + draft_steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", type=Path, help="gpu_shapes.py's JSON (the 8B row's costs)")
    parser.add_argument("--gpu", type=Path, action="append", default=[], help="a GPU bench JSON (acceptance)")
    parser.add_argument("--nodes", type=int, default=40, help="tree nodes verified per iteration (1,3,3,3: 40)")
    parser.add_argument("--draft-steps", type=float, default=1.0, help="plain steps a draft costs (pass: ~1)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    verify, host, source = verify_cost(args.shapes, args.nodes)
    sources = {f"gpu:{p.name}": p for p in args.gpu} or {f"cpu:{k}": v for k, v in CPU_BENCHES.items()}
    rows: list[dict[str, Any]] = []
    print(f"verification of {args.nodes} nodes = {verify:.2f} plain steps ({source}); draft = {args.draft_steps} steps")
    for name, path in sources.items():
        for accepted in acceptance(path):
            speedup = predict(accepted, verify, args.draft_steps)
            rows.append({"acceptance_from": name, "mean_accepted": accepted, "verify_over_step": verify,
                         "host_share": host, "cost_source": source, "predicted_speedup": speedup})  # fmt: skip
            print(f"  {name:12s} {accepted:5.2f} tokens/iteration -> {speedup:4.2f}x  (paper: {PAPER_SPEEDUP}x)")
    if args.out:
        args.out.write_text(json.dumps({"paper_speedup": PAPER_SPEEDUP, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
