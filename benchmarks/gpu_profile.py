"""Where a GPU step's time goes: one part per process, because cuBLAS reads its settings once.

    python benchmarks/gpu_profile.py hf          # transformers' forward, default cuBLAS settings
    python benchmarks/gpu_profile.py hf-invariant  # the same under backends/cuda/invariance.py's settings
    python benchmarks/gpu_profile.py padded      # the engine's exact plain step (PaddedBackend, CUDA graphs)
    python benchmarks/gpu_profile.py padded-eager  # the same launched op by op (TOKENSWIFT_CUDA_GRAPHS=0)
    python benchmarks/gpu_profile.py lean        # the engine's lean (not exact) step on the same device

Each prints the median milliseconds of a one-token step after `--context` tokens and the profiler's
top kernels and host ops; `--dry-run` runs tiny layers on a CPU (the script's logic only).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
from transformers import DynamicCache

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_shapes import build, sync, timed  # noqa: E402


def hf_step(model: torch.nn.Module, prompt: list[int], device: torch.device):
    cache = DynamicCache()
    model.set_attn_implementation("sdpa")
    with torch.no_grad():
        for start in range(0, len(prompt), 1024):
            chunk = torch.tensor([prompt[start : start + 1024]], device=device)
            model(input_ids=chunk, past_key_values=cache, use_cache=True, logits_to_keep=1)
    token = torch.tensor([[1]], device=device)

    def step() -> None:
        with torch.no_grad():
            model(input_ids=token, past_key_values=cache, use_cache=True, logits_to_keep=1)
            cache.crop(-1)  # drop the step's key again

    return step


def engine_step(model: torch.nn.Module, prompt: list[int], exact: bool):
    from tokenswift_cli.config import RunConfig
    from tokenswift_cli.engine.state import prefill
    from tokenswift_cli.model.target import Target

    target = Target(model)
    state = prefill(target, prompt, RunConfig(max_new_tokens=8, prefill_chunk=1024, mode="plain"))
    root = torch.tensor([state.root])

    def step() -> None:
        forward = target.forward(root, state.full, exact=exact)
        target.logits(forward.hidden)  # keys are written past the stored ones, never committed

    return step, type(target.backend).__name__


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("part", choices=["hf", "hf-invariant", "padded", "padded-eager", "lean"])
    parser.add_argument("--shape", default="qwen2.5-1.5b")
    parser.add_argument("--context", type=int, default=2048)
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    device = torch.device("cpu" if args.dry_run else "cuda")
    if args.part == "padded-eager":
        from tokenswift_cli.backends.cuda.graphs import GRAPHS

        os.environ[GRAPHS] = "0"
    if args.part == "hf-invariant":
        from tokenswift_cli.backends.cuda import invariance

        invariance.configure(device)
    model = build(args.shape, device, args.dry_run)
    prompt = torch.randint(0, model.config.vocab_size, (args.context,), generator=torch.Generator().manual_seed(0))
    backend = "transformers"
    if args.part.startswith("hf"):
        step = hf_step(model, prompt.tolist(), device)
    else:
        step, backend = engine_step(model, prompt.tolist(), exact=args.part.startswith("padded"))
    ms = timed(step, device, 20)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as profile:
        for _ in range(5):
            step()
        sync(device)
    table = profile.key_averages()
    report = {"part": args.part, "shape": args.shape, "context": args.context, "backend": backend, "step_ms": ms}
    print(json.dumps(report), flush=True)
    if device.type == "cuda":
        print(table.table(sort_by="self_cuda_time_total", row_limit=14, max_name_column_width=60))
    print(table.table(sort_by="self_cpu_time_total", row_limit=10, max_name_column_width=60))
    if args.out:
        with args.out.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(report) + "\n")


if __name__ == "__main__":
    main()
