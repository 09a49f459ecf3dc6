"""Kernels per layer of the padded backend's exact forward: torch ops against the Triton kernels.

Counts the ATen compute ops the graph body dispatches (each is a kernel in a CUDA graph's replay; views,
metadata and allocations launch nothing) plus the Triton launches, for a plain step and a 64-node
verification of the embedded model's shape, for each `TOKENSWIFT_ATTENTION` choice, and for the draft
pass (one token, not exact: TokenSwift's step 1). Runs the body
uncaptured, so it counts the same on a CPU (Triton interpreted, ~4 minutes) as on a GPU.

    python benchmarks/step_ops.py --layers 2 --out benchmarks/results/gpu-step/step-ops-cpu.json
    python benchmarks/step_ops.py --device cuda --out $OUT/step_ops.json        # on the GPU machine
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

if __name__ == "__main__":
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports Triton

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AutoModelForCausalLM, LlamaConfig

from tokenswift_cli.backends.cuda import graphs, padded
from tokenswift_cli.bench.host_syncs import FREE  # ops that launch no kernel
from tokenswift_cli.config import RunConfig
from tokenswift_cli.engine.state import prefill
from tokenswift_cli.engine.tree import build_tree
from tokenswift_cli.model.target import Target

ATTENTIONS = ("torch", "kernel", "kernel-dot")  # padded.ATTENTION's choices


class OpCounter(TorchDispatchMode):
    """Counts dispatched ATen ops by name, and Triton launches (whose own host copies, interpreted, are not ops)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter[str] = collections.Counter()
        self.triton = self.paused = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if not self.paused:
            self.ops[func.overloadpacket.__name__.rstrip("_")] += 1
        return func(*args, **(kwargs or {}))

    @property
    def kernels(self) -> int:
        return sum(count for name, count in self.ops.items() if name not in FREE)

    @contextlib.contextmanager
    def launches(self) -> Iterator[None]:
        """Count each Triton launch once (compiled: `JITFunction.run`; interpreted: the grid executor)."""
        from triton.runtime import interpreter, jit

        patched = [(jit.JITFunction, "run"), (interpreter.GridExecutor, "__call__")]
        originals = [getattr(owner, name) for owner, name in patched]

        def wrap(original: Any) -> Any:
            def launch(*args: Any, **kwargs: Any) -> Any:
                if self.paused:
                    return original(*args, **kwargs)
                self.triton += 1
                self.paused += 1
                try:
                    return original(*args, **kwargs)
                finally:
                    self.paused -= 1

            return launch

        for (owner, name), original in zip(patched, originals, strict=True):
            setattr(owner, name, wrap(original))
        try:
            yield
        finally:
            for (owner, name), original in zip(patched, originals, strict=True):
                setattr(owner, name, original)


def embedded_shaped(layers: int, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """SmolLM2-135M's shape (576 wide, 9 heads over 3 KV heads, head_dim 64), random weights."""
    config = LlamaConfig(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=layers, num_attention_heads=9,
        num_key_value_heads=3, max_position_embeddings=8192, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval().requires_grad_(False)


def count(
    target: Target, state: Any, tokens: torch.Tensor, depths: torch.Tensor, mask: torch.Tensor | None, exact: bool
) -> dict:
    target.forward(tokens, state.full, depths=depths, block_mask=mask, exact=exact)  # warm: the body's buffers
    counter = OpCounter()
    with counter.launches(), counter:
        target.forward(tokens, state.full, depths=depths, block_mask=mask, exact=exact)
    return {"aten_kernels": counter.kernels, "triton_kernels": counter.triton, "ops": dict(counter.ops)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    device = torch.device(args.device)
    os.environ[graphs.GRAPHS] = "body"  # the body a graph captures, run op by op
    if device.type == "cpu":
        os.environ[padded.FORCE] = "1"
    tree = build_tree(7, [(1, 2, 3, 4), (5, 6, 7, 8), (9, 10, 11)])  # 1 + 4 + 16 + 48 nodes: 64 rows
    rows: list[dict[str, Any]] = []
    for attention in ATTENTIONS:
        os.environ[padded.ATTENTION] = attention
        for layers in (args.layers, 2 * args.layers):  # the difference is per layer, the rest per forward
            target = Target(embedded_shaped(layers, device, torch.bfloat16))
            assert target.backend.kernel_attention == (attention != "torch")
            state = prefill(target, list(range(1, 200)), RunConfig(max_new_tokens=8, prefill_chunk=256, mode="plain"))
            root, first = torch.tensor([state.root]), torch.zeros(1, dtype=torch.long)
            for name, tokens, depths, mask, exact in (
                ("plain step", root, first, None, True),
                ("verify 64", tree.tokens[:64], tree.depths[:64], tree.mask[:64, :64], True),
                ("draft pass", root, first, None, False),  # one token, not exact: its own graphs
            ):
                row = count(target, state, tokens, depths, mask, exact)
                rows.append({"attention": attention, "layers": layers, "forward": name, **row})
    table = []
    for attention in ATTENTIONS:
        for name in ("plain step", "verify 64", "draft pass"):
            few, many = (r for r in rows if r["attention"] == attention and r["forward"] == name)
            total = lambda r: r["aten_kernels"] + r["triton_kernels"]  # noqa: E731
            per_layer = (total(many) - total(few)) / (many["layers"] - few["layers"])
            fixed = total(few) - per_layer * few["layers"]
            table.append({"attention": attention, "forward": name, "kernels_per_layer": per_layer,
                          "kernels_outside_layers": fixed})  # fmt: skip
    print(f"{'attention':<10} {'forward':<12} {'kernels/layer':>14} {'outside layers':>15}")
    for row in table:
        print(f"{row['attention']:<10} {row['forward']:<12} {row['kernels_per_layer']:>14.1f} "
              f"{row['kernels_outside_layers']:>15.1f}")  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    document = {"device": str(device), "torch": torch.__version__, "table": table, "rows": rows}
    args.out.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
