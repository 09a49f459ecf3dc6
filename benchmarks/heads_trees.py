import json, sys, torch
from dataclasses import replace
from tokenswift_cli.config import DraftConfig, ModelSpec
from tokenswift_cli.data import HELD_OUT_TEXT
from tokenswift_cli.model.heads import resolve_heads
from tokenswift_cli.model.loading import end_of_text_ids, load_model
from tokenswift_cli.sampling.defaults import PAPER
from tokenswift_cli.train.acceptance import replay, write_text
torch.set_num_threads(1)
loaded = load_model(ModelSpec(name="default", weights="dense", dtype="float32"), attn_implementation="sdpa")
heads, _ = resolve_heads(sys.argv[1], loaded)
sampling = replace(PAPER, seed=0, suppress_token_ids=tuple(end_of_text_ids(loaded)))
out = []
for prefix in (1024, 2048, 3072):
    prompt = loaded.tokenizer(HELD_OUT_TEXT.read_text())["input_ids"][:prefix]
    tokens = write_text(loaded.model, prompt, 512, sampling)
    for tree in ((1, 3, 3, 3), (2, 3, 3, 3), (3, 3, 3, 3), (3, 2, 2, 2)):
        r = replay(loaded.model, heads, tokens, prefix, sampling=sampling, draft=DraftConfig(tree=tree))
        row = {"prefix": prefix, "tree": tree, **r.to_dict()}
        out.append(row); print(json.dumps({k: row[k] for k in ("prefix", "tree", "heads", "no_heads", "oracle", "heads_every_root", "no_heads_every_root")}), flush=True)
json.dump(out, open(sys.argv[2], "w"), indent=1)
