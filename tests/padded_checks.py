"""Checks of the padded (CUDA) backend shared by the CPU tests and the GPU tests: one device argument apart."""

from __future__ import annotations

import torch
from helpers import first_divergence, random_heads, random_prompt

from tokenswift_cli.config import ContextWindow, DraftConfig, RunConfig, SamplingConfig
from tokenswift_cli.engine.decode import generate_tokens
from tokenswift_cli.engine.tree import Tree
from tokenswift_cli.model.cache import FullCache
from tokenswift_cli.model.target import Target

GREEDY = SamplingConfig()
SEEDED = SamplingConfig(temperature=1.0, min_p=0.05, seed=3)
WINDOW = ContextWindow(size=64, sinks=4)


def _prefilled(target: Target, prompt: torch.Tensor) -> FullCache:
    cache = FullCache(target.num_layers, prompt.shape[0] + 400)
    target.forward(prompt, cache)
    cache.commit(range(prompt.shape[0]))
    return cache


def chain_rows_differing(target: Target, rows: int, *, prompt_length: int = 50) -> list[int]:
    """Rows of one exact forward over `rows` chained tokens whose hidden state differs from the same
    token's in a one-row exact forward (each committed in turn)."""
    prompt, chain = torch.tensor(random_prompt(prompt_length)), torch.tensor(random_prompt(rows, seed=3))
    together = target.forward(chain, _prefilled(target, prompt), exact=True).hidden
    cache, differing = _prefilled(target, prompt), []
    for index, token in enumerate(chain):
        alone = target.forward(token[None], cache, exact=True).hidden[0]
        cache.commit([0])
        if not torch.equal(alone, together[index]):
            differing.append(index)
    return differing


def tree_rows_differing(target: Target, tree: Tree, *, prompt_length: int = 50) -> list[int]:
    """Nodes of a verified `tree` whose hidden state differs from decoding their path one token at a time."""
    prompt = torch.tensor(random_prompt(prompt_length))
    verified = target.forward(
        tree.tokens, _prefilled(target, prompt), depths=tree.depths, block_mask=tree.mask, exact=True
    ).hidden
    differing = []
    for node in range(tree.size):
        cache = _prefilled(target, prompt)
        for token in tree.path_tokens(node):
            alone = target.forward(torch.tensor([token]), cache, exact=True).hidden[0]
            cache.commit([0])
        if not torch.equal(alone, verified[node]):
            differing.append(node)
    return differing


def tokenswift_equals_plain(
    target: Target, sampling: SamplingConfig, *, window: ContextWindow | None = None, tokens: int = 200
) -> tuple[int | None, int, int]:
    """(first divergence, iterations, tokens) of TokenSwift against plain decoding on a random prompt."""
    heads, prompt = random_heads(target).to(device=target.device, dtype=target.dtype), random_prompt(150)
    cfg = RunConfig(max_new_tokens=tokens, sampling=sampling, prefill_chunk=32, window=window)
    plain, _ = generate_tokens(target, None, prompt, cfg.replace(mode="plain"))
    fast, stats = generate_tokens(target, heads, prompt, cfg.replace(draft=DraftConfig(tree=(1, 3, 3, 3))))
    return first_divergence(fast, plain), stats.iterations, len(plain)
