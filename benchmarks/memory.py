"""Where the resident memory of a `tokenswift write` goes, stage by stage, with the embedded model.

    python benchmarks/memory.py --prefix-tokens 8192 --tokens 2048 --threads 1 --json memory.json

Loads the model as `write` does (4-bit decoder, Q8_0 head), prefills the first --prefix-tokens of a
book (past the trained 8,192 positions the automatic 4K context window holds the cache, as in any
long run), then writes --tokens tokens with the defaults, checkpointing every 512 tokens into a
temporary folder. Prints, after each stage, the resident set (RSS), its peak so far (VmHWM, Linux),
and the sizes that bound it: the model's tensors and the KV cache as allocated. The issue-4 target
compares the peak above the imports with model + KV cache + 20%.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from tokenswift_cli.data import DEFAULT_TEXT

MIB = 2**20
BOOK = DEFAULT_TEXT


def status() -> dict[str, float]:
    """VmRSS, VmHWM, RssAnon and RssFile of this process in MiB (Linux)."""
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
            fields[key] = int(value.split()[0]) / 1024
    return fields


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prefix-tokens", type=int, default=8192)
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path, help="Also write the stages here.")
    args = parser.parse_args()
    stages: list[dict[str, Any]] = []

    def stage(name: str, **sizes: float) -> None:
        stages.append({"stage": name, **status(), **sizes})

    stage("python")
    import torch

    torch.set_num_threads(args.threads)
    from tokenswift_cli.config import DraftConfig, ModelSpec, RunConfig
    from tokenswift_cli.engine import decode
    from tokenswift_cli.engine.state import prefill
    from tokenswift_cli.runs.checkpoint import Checkpointer
    from tokenswift_cli.runs.run_model import bind_scripts, fit_window, load_run_model, suppress_eos, unscaled
    from tokenswift_cli.runs.textstream import StreamState
    from tokenswift_cli.sampling import defaults

    stage("imports (torch, transformers, tokenswift)")
    spec = ModelSpec()  # as `write`: loaded unscaled, the automatic window resolved from the run's length
    cfg = RunConfig(
        max_new_tokens=args.tokens,
        sampling=defaults.default_sampling(),
        draft=DraftConfig().drafting("auto"),
        window=defaults.automatic_window(),
    )
    loaded = load_run_model(unscaled(spec), "default", cfg, lambda _: None)
    target = loaded.target
    tensors = [*target.model.parameters(), *target.model.buffers()]
    model_mib = sum(t.numel() * t.element_size() for t in tensors) / MIB
    if target.q8_head is not None:
        model_mib += sum(t.numel() * t.element_size() for t in (target.q8_head.packed, target.q8_head.scales)) / MIB
    stage("model loaded", model_mib=model_mib)

    prompt = loaded.tokenizer(BOOK.read_text(encoding="utf-8"))["input_ids"][: args.prefix_tokens]
    prefix = loaded.tokenizer.decode(prompt)
    cfg = bind_scripts(suppress_eos(fit_window(cfg, spec, target, len(prompt)), loaded.eos_ids), loaded, prefix)
    state = prefill(target, prompt, cfg)
    kv_mib = (
        sum(
            t.numel() * t.element_size()
            for layer in state.full.layer_list
            for t in (layer.keys, layer.values)
            if t is not None
        )
        / MIB
    )
    stage(f"prefilled {len(prompt)} tokens (window {cfg.window})", kv_mib=kv_mib)

    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        saver = Checkpointer(Path(folder), fingerprints={"model": "m", "heads": None})
        saved = 0
        for _ in decode.generate(target, loaded.heads, state, cfg, eos_ids=loaded.eos_ids):
            if state.stats.generated - saved >= 512:
                saver.save(state, stream=StreamState((), 0), text_bytes=0)
                saved = state.stats.generated
    seconds = time.perf_counter() - started
    stage(f"wrote {state.stats.generated} tokens ({seconds:.0f} s), checkpoints every 512", kv_mib=kv_mib)

    base = stages[1]["VmRSS"]
    peak = max(s["VmHWM"] for s in stages)
    print(f"{'stage':<58} {'RSS':>6} {'peak':>6} {'anon':>6} {'file':>6}  (MiB)")
    for s in stages:
        print(f"{s['stage']:<58} {s['VmRSS']:6.0f} {s['VmHWM']:6.0f} {s['RssAnon']:6.0f} {s['RssFile']:6.0f}")
    bound = (model_mib + kv_mib) * 1.2
    print(
        f"model tensors {model_mib:.0f} MiB, KV cache as allocated {kv_mib:.0f} MiB: (model + KV) x 1.2 = {bound:.0f}"
    )
    print(f"peak above the imports: {peak - base:.0f} MiB ({'within' if peak - base <= bound else 'above'} it)")
    if args.json:
        summary = {"model_mib": model_mib, "kv_mib": kv_mib, "imports_mib": base, "peak_mib": peak}
        args.json.write_text(json.dumps({"stages": stages, **summary}, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
