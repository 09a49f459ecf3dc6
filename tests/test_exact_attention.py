"""Batch-invariant attention: the same bits for a token verified in a tree or decoded alone (bfloat16),
and the same values as the fast path (float32); TokenSwift == plain decoding in bfloat16."""

from __future__ import annotations

import pytest
import torch
from helpers import first_divergence, random_heads, random_prompt, tiny_target

from tokenswift_cli.backends.cpu.exact_attention import exact_attention
from tokenswift_cli.config import ContextWindow, DraftConfig, RunConfig, SamplingConfig
from tokenswift_cli.engine.decode import generate_tokens
from tokenswift_cli.engine.tree import build_tree
from tokenswift_cli.model.attention import attend
from tokenswift_cli.model.target import Target

TREE = build_tree(0, [(1, 2, 3), (4, 5), (6, 7)])  # 1 + 3 + 6 + 12 nodes, depth 3


def _inputs(committed: int, dtype: torch.dtype, seed: int = 0):  # type: ignore[no-untyped-def]
    torch.manual_seed(seed)
    q = TREE.size
    query = torch.randn(1, 6, q, 32).to(dtype)
    keys, values = torch.randn(1, 2, committed + q, 32).to(dtype), torch.randn(1, 2, committed + q, 32).to(dtype)
    return query, keys, values


@pytest.mark.parametrize("committed", [5, 300, 700])
def test_exact_attention_computes_attention(committed: int) -> None:
    query, keys, values = _inputs(committed, torch.float32)
    positions = committed + TREE.depths
    got = exact_attention(query, keys, values, positions=positions, committed=committed, block_mask=TREE.mask,
                          scaling=0.2, block=64)  # fmt: skip
    expected = attend(query, keys, values, committed=committed, block_mask=TREE.mask, scaling=0.2)
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("committed", [5, 300, 700, 62, 127])  # 62 and 127: the tree crosses a block edge
@pytest.mark.parametrize("window", [None, 100])
def test_a_tree_row_gets_the_bits_of_the_same_token_decoded_alone(
    committed: int, window: int | None, dtype: torch.dtype
) -> None:
    query, keys, values = _inputs(committed, dtype, seed=committed)
    sinks = 4 if window else 0
    sink_query = torch.randn_like(query) if window else None
    positions = committed + TREE.depths
    common = {"scaling": 0.2, "block": 64, "sinks": sinks, "window": window, "first_recent": sinks}
    tree_out = exact_attention(query, keys, values, positions=positions, committed=committed, block_mask=TREE.mask,
                               sink_query=sink_query, **common)  # fmt: skip
    for row in range(TREE.size):
        path = torch.nonzero(TREE.mask[row]).flatten()  # ancestors and itself, by depth
        depth = int(TREE.depths[row])
        order = torch.cat([torch.arange(committed), committed + path])
        alone = exact_attention(
            query[:, :, row : row + 1], keys[:, :, order], values[:, :, order], positions=positions[row : row + 1],
            committed=committed + depth, block_mask=torch.ones(1, 1, dtype=torch.bool),
            sink_query=sink_query[:, :, row : row + 1] if sink_query is not None else None, **common,
        )  # fmt: skip
        assert torch.equal(alone[:, 0], tree_out[:, row]), row


WINDOW = ContextWindow(size=64, sinks=4)
CASES = [(f, w) for w in (None, WINDOW) for f in ("llama-mha", "llama-gqa", "qwen2")]


@pytest.mark.parametrize(("family", "window"), CASES, ids=[f"{f}-{'window' if w else 'full'}" for f, w in CASES])
@pytest.mark.parametrize("sampling", [SamplingConfig(), SamplingConfig(temperature=1.0, min_p=0.05, seed=3)],
                         ids=["greedy", "sampling"])  # fmt: skip
def test_bfloat16_tokenswift_equals_bfloat16_plain(
    family: str, window: ContextWindow | None, sampling: SamplingConfig
) -> None:
    target = Target(tiny_target(family).model.to(torch.bfloat16))
    heads, prompt = random_heads(target).to(torch.bfloat16), random_prompt(150)
    cfg = RunConfig(max_new_tokens=240, sampling=sampling, prefill_chunk=32, window=window)
    plain, _ = generate_tokens(target, None, prompt, cfg.replace(mode="plain"))
    fast, stats = generate_tokens(target, heads, prompt, cfg.replace(draft=DraftConfig(tree=(1, 3, 3, 3))))
    assert first_divergence(fast, plain) is None
    assert stats.iterations < len(plain)
