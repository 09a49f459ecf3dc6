"""Continue a run's own text from token 20,000 with the penalty on or off: does it collapse? (record/quality.md)

    .venv/bin/python benchmarks/penalty_probe.py PENALTY NEW_TOKENS   # 1.15 4000, then 1.0 4000

The run folder is /work/qruns/runs/run-001 (the 32K run of benchmarks/record/quality.md); edit `run` for another.
"""

import json
import sys
import time

import torch
from safetensors.torch import load_file

from tokenswift_cli.config import ModelSpec, RunConfig, SamplingConfig
from tokenswift_cli.engine.decode import generate
from tokenswift_cli.engine.state import prefill
from tokenswift_cli.model.loading import load_model
from tokenswift_cli.model.target import Target

torch.set_num_threads(1)
penalty = float(sys.argv[1])
start, new = 20000, int(sys.argv[2])
run = "/work/qruns/runs/run-001"
m = json.load(open(run + "/checkpoint/manifest.json"))
st = next(f["name"] for f in m["files"] if f["kind"] == "state")
tokens = load_file(run + "/checkpoint/" + st)["tokens"].tolist()
prefix_len = m["state"]["prefix_length"]
prompt = tokens[: prefix_len + start]
lm = load_model(ModelSpec(dtype="bfloat16", rope_scaling="yarn", rope_factor=4.0))
target = Target(lm.model)
vocab = lm.tokenizer.convert_ids_to_tokens(list(range(len(lm.tokenizer))))
space = [v.startswith("Ġ") or v.startswith("Ċ") for v in vocab]
sampling = SamplingConfig(
    temperature=1.0,
    min_p=0.1,
    penalty=penalty if penalty != 1.0 else None,
    penalty_window=512,
    seed=0,
    suppress_token_ids=(0, 2),
)
cfg = RunConfig(max_new_tokens=new, mode="plain", sampling=sampling)
state = prefill(target, prompt, cfg)
out, t0 = [], time.time()
for ev in generate(target, None, state, cfg):
    out += ev.tokens
    if len(out) % 500 < len(ev.tokens):
        chunk = out[-500:]
        share = sum(space[t] for t in chunk) / len(chunk)
        span = f"{start + len(out) - 500}-{start + len(out)}"
        print(f"penalty {penalty}: tokens {span} space-led {share:.2f} ({time.time() - t0:.0f}s)", flush=True)
text = lm.tokenizer.decode(out)
open(f"/work/qruns/probe-{penalty}.txt", "w").write(text)
print("end:", repr(text[-300:]))
