"""Host synchronisations and eager launches per engine iteration, counted on the GPU itself (issue 33).

    python benchmarks/gpu_syncs.py --out $OUT/syncs.json                       # on the GPU machine
    TOKENSWIFT_PADDED=1 python benchmarks/gpu_syncs.py --dry-run --out /tmp/s.json  # the logic, on a CPU

The CPU count (`bench/host_syncs.py`, `tests/test_host_syncs.py`) cannot see host-to-device copies
(on a CPU nothing moves); CUDA's sync debug mode warns at every operation that makes the host wait,
copies included. A random model of the embedded model's shape (bfloat16) after 2,048 random tokens,
with random heads: plain and the paper's draft pass, greedy and at the paper's sampling, with the
walk on the device (the default on a GPU) and on the host. Per iteration: synchronisations, eager ops
(`TorchDispatchMode`, graph replays are one each), milliseconds.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import warnings
from pathlib import Path
from typing import Any

import torch

from tokenswift_cli.bench.host_syncs import counting
from tokenswift_cli.bench.models import _random_heads
from tokenswift_cli.config import RunConfig, SamplingConfig
from tokenswift_cli.engine.decode import generate
from tokenswift_cli.engine.state import prefill
from tokenswift_cli.engine.walk import WALK
from tokenswift_cli.model.target import Target

PAPER = SamplingConfig(temperature=1.0, min_p=0.1, penalty=1.2, penalty_window=1024, seed=0)
CASES = {
    "plain greedy": ("plain", SamplingConfig()),
    "plain paper": ("plain", PAPER),
    "pass greedy": ("tokenswift", SamplingConfig()),
    "pass paper": ("tokenswift", PAPER),
}


def iterations(target: Target, prompt: list[int], mode: str, sampling: SamplingConfig, walk: str, n: int) -> dict:
    os.environ[WALK] = walk
    cfg = RunConfig(max_new_tokens=4 * n + 64, sampling=sampling, mode=mode, prefill_chunk=1024)  # type: ignore[arg-type]
    if mode == "tokenswift":
        cfg = cfg.replace(draft=cfg.draft.drafting("pass"))
    heads = _random_heads(target.model) if mode == "tokenswift" else None
    state = prefill(target, prompt, cfg)
    steps = generate(target, heads, state, cfg)
    for _ in range(3):  # graphs captured, buffers made
        next(steps)
    cuda = target.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("warn")
    with warnings.catch_warnings(record=True) as seen, counting() as counts:
        warnings.simplefilter("always")
        start = time.perf_counter()
        for _ in range(n):
            next(steps)
        if cuda:
            torch.cuda.set_sync_debug_mode("default")
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
    syncs = [str(w.message).splitlines()[0] for w in seen if "synchroniz" in str(w.message)]
    return {
        "cuda_syncs_per_iteration": len(syncs) / n if cuda else None,
        "cpu_count_syncs_per_iteration": counts.total_syncs / n,
        "eager_ops_per_iteration": counts.total_eager_ops / n,
        "eager_ops_by_phase": {k: v / n for k, v in counts.eager_ops.items()},
        "ms_per_iteration": seconds * 1000 / n,
        "tokens_per_iteration": state.stats.generated / max(state.stats.iterations, 1),
        "first_syncs": sorted(set(syncs))[:5],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="a tiny model on the CPU")
    parser.add_argument("--context", type=int, default=2048)
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    from gpu_shapes import build  # benchmarks/: the shapes' models

    device = torch.device("cpu" if args.dry_run else "cuda")
    context, n = (128, 4) if args.dry_run else (args.context, args.iterations)
    target = Target(build("smollm2-135m", device, args.dry_run))
    vocab = target.model.config.vocab_size
    prompt = torch.randint(0, vocab, (context,), generator=torch.Generator().manual_seed(1)).tolist()
    rows: list[dict[str, Any]] = []
    for name, (mode, sampling) in CASES.items():
        for walk in ("device", "host"):
            row = {"case": name, "walk": walk, **iterations(target, prompt, mode, sampling, walk, n)}
            rows.append(row)
            print(
                f"{name:13} walk={walk:6} syncs/it cuda={row['cuda_syncs_per_iteration']} "
                f"cpu-count={row['cpu_count_syncs_per_iteration']:.1f} "
                f"eager ops/it={row['eager_ops_per_iteration']:.0f} "
                f"{row['ms_per_iteration']:.2f} ms/it {row['tokens_per_iteration']:.2f} tok/it",
                flush=True,
            )
    device_name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu (dry run)"
    args.out.write_text(json.dumps({"device": device_name, "context": context, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
