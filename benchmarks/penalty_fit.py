"""How far each sampling setting moves the model away from real prose (benchmarks/record/quality.md, issue 6).

Teacher-forced on a reference text: one forward gives the model's logits at every position; each
setting's target distribution (the engine's own `sampling.target_scores`, penalty window over the
text's real preceding tokens) is then scored on the true next token. A setting that is too harsh
pushes real text's own words down (higher NLL than the raw model) and filters them out (coverage).

    .venv/bin/python benchmarks/penalty_fit.py src/tokenswift_cli/data/texts/britannica-shakespeare-biography.txt
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from tokenswift_cli.config import ModelSpec, SamplingConfig
from tokenswift_cli.model.loading import load_model
from tokenswift_cli.sampling.distribution import target_scores

SETTINGS = {
    "raw (t=1, nothing else)": SamplingConfig(temperature=1.0),
    "t=0.8": SamplingConfig(temperature=0.8),
    "penalty 1.05 / 1024": SamplingConfig(temperature=1.0, penalty=1.05, penalty_window=1024),
    "penalty 1.1 / 64": SamplingConfig(temperature=1.0, penalty=1.1, penalty_window=64),
    "penalty 1.1 / 256": SamplingConfig(temperature=1.0, penalty=1.1, penalty_window=256),
    "penalty 1.1 / 1024": SamplingConfig(temperature=1.0, penalty=1.1, penalty_window=1024),
    "penalty 1.15 / 512": SamplingConfig(temperature=1.0, penalty=1.15, penalty_window=512),
    "penalty 1.2 / 64": SamplingConfig(temperature=1.0, penalty=1.2, penalty_window=64),
    "penalty 1.2 / 256": SamplingConfig(temperature=1.0, penalty=1.2, penalty_window=256),
    "penalty 1.2 / 1024 (paper)": SamplingConfig(temperature=1.0, penalty=1.2, penalty_window=1024),
    "penalty 1.3 / 1024": SamplingConfig(temperature=1.0, penalty=1.3, penalty_window=1024),
}
MIN_PS = (0.05, 0.1)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("text")
    p.add_argument("--start", type=int, default=1024, help="first scored position (the window is full there)")
    p.add_argument("--end", type=int, default=4096)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    loaded = load_model(ModelSpec())
    assert loaded.tokenizer is not None
    ids = loaded.tokenizer(Path(a.text).read_text(encoding="utf-8"))["input_ids"][: a.end + 1]
    tokens = torch.tensor(ids)
    with torch.no_grad():
        hidden = loaded.model.get_decoder()(input_ids=tokens[None, : a.end]).last_hidden_state[0]  # [end, hidden]
        logits = loaded.model.get_output_embeddings()(hidden[a.start - 1 :]).float()  # [scored, vocab]
    print(f"scored positions {a.start}-{a.end} of {Path(a.text).name}")
    print(
        "| setting | NLL of the true token | change vs raw | " + " | ".join(f"kept by min-p {m}" for m in MIN_PS) + " |"
    )
    print("| --- | --- | --- | " + " | ".join("---" for _ in MIN_PS) + " |")
    raw = None
    for name, cfg in SETTINGS.items():
        nll, kept = score(logits, tokens, a.start, cfg)
        raw = nll if raw is None else raw
        print(f"| {name} | {nll:.3f} | {nll - raw:+.3f} | " + " | ".join(f"{k:.1%}" for k in kept) + " |")


def score(logits: torch.Tensor, tokens: torch.Tensor, start: int, cfg: SamplingConfig) -> tuple[float, list[float]]:
    """Mean NLL of the true tokens under `cfg` (no truncation) and the share each min-p keeps."""
    total, kept = 0.0, [0] * len(MIN_PS)
    for i in range(logits.shape[0]):
        position = start + i
        scores = target_scores(logits[i], tokens[:position], cfg)  # [vocab]
        logp = torch.log_softmax(scores.double(), dim=-1)
        true = int(tokens[position])
        total -= float(logp[true])
        for j, m in enumerate(MIN_PS):  # min-p keeps tokens with p >= m * p_max
            kept[j] += bool(logp[true] >= logp.max() + torch.log(torch.tensor(m, dtype=logp.dtype)))
    n = logits.shape[0]
    return total / n, [k / n for k in kept]


if __name__ == "__main__":
    main()
