"""What a GPU user gets from `transformers` alone: `generate()` with a static cache, compiled, warmed up.

    python benchmarks/gpu_generate.py --out plan.jsonl      # the embedded model, bf16, greedy, 1,024 after 2,048

Its own process, so none of the engine's batch-invariance settings (cuBLAS workspace, reduced-precision
reductions) are in force: the stock setup. `generate()` compiles its forward with torch.compile when the
cache is static; the first call (same prompt and length) compiles and is not timed. Each timed call is
clocked from its second new token (a streamer), so neither the prefill nor the first step counts: the
milliseconds a token of steady decoding, the figure plain decoding must beat. Results: JSON lines.
`--dry-run`: a tiny random model on this CPU, uncompiled (checks the script, not the GPU).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from transformers import GenerationConfig

from tokenswift_cli.bench.models import quick_model
from tokenswift_cli.bench.stock import FirstTokenClock, stock_generate
from tokenswift_cli.config import ModelSpec
from tokenswift_cli.data import HELD_OUT_TEXT


def timed_call(model: torch.nn.Module, ids: torch.Tensor, config: GenerationConfig) -> tuple[float, int]:
    """(seconds from the second new token to the end, tokens in that span) of one `generate()` call."""
    clock = FirstTokenClock()
    with torch.no_grad():
        out = model.generate(ids, generation_config=config, streamer=clock)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    end = time.perf_counter()
    assert clock.first is not None
    return end - clock.first, out.shape[1] - ids.shape[1] - clock.first_count


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON lines, appended")
    parser.add_argument("--prefix-tokens", type=int, default=2048)
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args(argv)
    if args.dry_run:
        model, device = quick_model(), "cpu"
        prompt = torch.randint(2, 100, (1, 64)).tolist()[0]
        args.tokens, args.repeats = 16, 2
    else:
        from tokenswift_cli.model.loading import load_model

        loaded = load_model(ModelSpec(device="cuda", dtype="bfloat16", weights="dense"))
        model, device = loaded.model, torch.cuda.get_device_name()
        text = HELD_OUT_TEXT.read_text(encoding="utf-8")
        prompt = loaded.tokenizer(text, add_special_tokens=False)["input_ids"][: args.prefix_tokens]
    ids = torch.tensor([prompt], device=model.device)
    config = GenerationConfig(
        max_new_tokens=args.tokens, min_new_tokens=args.tokens, do_sample=False, pad_token_id=0,
        cache_implementation="static", disable_compile=args.dry_run,
    )  # fmt: skip
    with stock_generate(model):
        start = time.perf_counter()
        timed_call(model, ids, config)  # compiles (on CUDA) and warms up: not counted
        warm_up = time.perf_counter() - start
        runs = [timed_call(model, ids, config) for _ in range(args.repeats)]
    ms = [1000 * seconds / tokens for seconds, tokens in runs]
    result = {
        "device": device, "step": "generate_compiled", "prefix": len(prompt), "tokens": args.tokens,
        "ms_per_token": round(statistics.median(ms), 3), "runs_ms_per_token": [round(m, 3) for m in ms],
        "warm_up_seconds": round(warm_up, 1), "compiled": not args.dry_run, "torch": torch.__version__,
        "matmul_bf16_reduced_precision": torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction,
    }  # fmt: skip
    line = json.dumps(result)
    print(line)
    with args.out.open("a") as out:
        out.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
