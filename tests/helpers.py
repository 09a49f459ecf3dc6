"""Shared test helpers: a tiny model wrapped for the engine, random heads, a random prompt, where two token
lists first differ."""

from __future__ import annotations

import torch
from conftest import VOCAB, tiny_model

from tokenswift_cli.bench.compare import first_divergence as first_divergence  # the library's, for the tests
from tokenswift_cli.model.heads import DraftHeads
from tokenswift_cli.model.target import Target


def tiny_target(family: str, seed: int = 0) -> Target:
    return Target(tiny_model(family, seed))


def random_heads(target: Target, num_heads: int = 3, seed: int = 0) -> DraftHeads:
    torch.manual_seed(seed)
    heads = DraftHeads.for_model(target.model.config, num_heads)
    for block in heads.medusa_layers:
        torch.nn.init.normal_(block.linear.weight, std=0.1)  # type: ignore[union-attr]
    return heads


def random_prompt(length: int, seed: int = 1) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(2, VOCAB, (length,), generator=generator).tolist()


def assert_windowed_sampling_is_lossless(target: Target, tokens: int = 200, kv_cache: str = "auto") -> None:
    """Seeded sampling under a 64-token window: TokenSwift writes plain decoding's text, in fewer steps."""
    from tokenswift_cli.config import ContextWindow, RunConfig, SamplingConfig
    from tokenswift_cli.engine.decode import generate_tokens

    heads, prompt = random_heads(target), random_prompt(60)
    sampling = SamplingConfig(temperature=1.0, min_p=0.05, seed=5)
    window = ContextWindow(size=64, sinks=4)
    cfg = RunConfig(max_new_tokens=tokens, sampling=sampling, window=window, kv_cache=kv_cache)  # type: ignore[arg-type]
    plain, _ = generate_tokens(target, None, prompt, cfg.replace(mode="plain"))
    fast, stats = generate_tokens(target, heads, prompt, cfg)
    assert first_divergence(fast, plain) is None and stats.iterations < tokens
