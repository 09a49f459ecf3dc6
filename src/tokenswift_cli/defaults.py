"""Default sampling settings, chosen by measurement for the embedded model (evidence: docs/quality.md).

SmolLM2-135M-Instruct, measured on this project's CPU (issue 6):
* No penalty loops: 1024 tokens after a story prompt ended in one sentence repeated ~60 times
  (repeated-sentence rate 82%, Distinct-4 0.17, compression ratio 10.4).
* The paper's penalty (1.2 over the last 1024 tokens) is too harsh for this model: on real prose it
  costs +0.58 nats per token against the raw model (1.8x less likely), and after an 11K-token prose
  prefix (which fills the window) it wrote word salad from the first token, with or without YaRN.
* 1.1 over the last 256 tokens costs +0.18 nats on real prose, prevents the loop, and kept the text
  readable after the same 11K-token prefix.
* min-p 0.1 cuts the tail that turns a small model's text into noise; temperature 1 keeps the
  model's own distribution (0.8 moved real prose's NLL by +0.13 nats in the same test).
Context: YaRN is applied automatically past the trained 8192 positions (`ModelSpec.rope_scaling`
"auto"): as configured the model's NLL on real prose rises from ~3 to 6-7 nats past ~12K positions.
End-of-text tokens are suppressed unless the run stops at them (`suppressed_ids`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from .config import SamplingConfig

EMBEDDED = SamplingConfig(temperature=1.0, min_p=0.1, penalty=1.1, penalty_window=256)
# The TokenSwift paper's settings (theta 1.2 over W 1024, min-p 0.1), measured there on 7-8B models.
PAPER = SamplingConfig(temperature=1.0, min_p=0.1, penalty=1.2, penalty_window=1024)


def default_sampling(model_name: str = "default") -> SamplingConfig:
    """The sampling a run gets when the user sets none: measured for the embedded model, the paper's else."""
    return EMBEDDED if model_name == "default" else PAPER


def suppressed_ids(sampling: SamplingConfig, eos_ids: Sequence[int], *, stop_at_eos: bool) -> SamplingConfig:
    """`sampling` with the end-of-text tokens never drawn, unless the run stops at them.

    Recorded in the run's settings with the rest of the sampling, so resume and the plain baseline
    suppress exactly the same tokens.
    """
    if stop_at_eos:
        return sampling
    merged = tuple(sorted({*sampling.suppress_token_ids, *(int(t) for t in eos_ids)}))
    return dataclasses.replace(sampling, suppress_token_ids=merged)
