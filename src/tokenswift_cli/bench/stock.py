"""`generate()` and its prompt lookup, the stock `transformers` methods, set to the engine's distribution.

`generate()` fills every setting left unset from the model's own generation config: an `eos_token_id`
of None brought the model's end-of-text token back, and a run stopped at 19 of 128 tokens. Here it
runs on a blank generation config, with the end-of-text tokens the engine suppresses suppressed too,
so that both write the same number of tokens from the same distribution.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from transformers import GenerationConfig

from tokenswift_cli.config import SamplingConfig


def generation_config(sampling: SamplingConfig, new_tokens: int) -> GenerationConfig:
    """`generate()` settings for the engine's `sampling`: same length, suppressed tokens, penalty and warpers.

    The penalty covers the whole text (generate() has no window); DRY and the scripts filter have no
    counterpart (`compare.generate_gaps` says so).
    """
    config = GenerationConfig(
        max_new_tokens=new_tokens, pad_token_id=0, do_sample=not sampling.greedy,
        repetition_penalty=sampling.penalty or 1.0, suppress_tokens=list(sampling.suppress_token_ids) or None,
    )  # fmt: skip
    if not sampling.greedy:
        config.temperature, config.min_p = sampling.temperature, sampling.min_p
        config.top_k, config.top_p, config.eta_cutoff = sampling.top_k or 0, sampling.top_p or 1.0, sampling.eta or 0.0
    return config


class stock_generate:
    """The stock model as `generate()` users run it (`sdpa` attention), with a blank generation config."""

    def __init__(self, model: Any) -> None:
        self.model, self.attention, self.generation = model, model.config._attn_implementation, model.generation_config

    def __enter__(self) -> None:
        self.model.set_attn_implementation("sdpa")
        self.model.generation_config = GenerationConfig()

    def __exit__(self, *exc: object) -> None:
        self.model.set_attn_implementation(self.attention)
        self.model.generation_config = self.generation


class FirstTokenClock:
    """A `generate()` streamer that notes when the first new tokens arrive (after the prompt)."""

    def __init__(self) -> None:
        self.calls, self.first_count = 0, 0
        self.first: float | None = None

    def put(self, value: torch.Tensor) -> None:
        self.calls += 1
        if self.calls == 2:
            self.first, self.first_count = time.perf_counter(), int(value.numel())

    def end(self) -> None:
        pass
