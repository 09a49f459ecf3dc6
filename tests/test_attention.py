"""The attention fast path: split attention and the lean forward equal the stock computation."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import tiny_target

from tokenswift_cli.engine.tree import build_tree
from tokenswift_cli.model import attention
from tokenswift_cli.model.attention import attend, masked_attention, pack_queries, split_attention
from tokenswift_cli.model.cache import FullCache
from tokenswift_cli.model.target import Target


def reference(query, keys, values, committed: int, block_mask) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """Repeated KV heads and one full bool mask: the textbook computation."""
    heads, q_len = query.shape[1], query.shape[2]
    group = heads // keys.shape[1]
    k, v = keys.repeat_interleave(group, dim=1), values.repeat_interleave(group, dim=1)
    mask = torch.cat([torch.ones(q_len, committed, dtype=torch.bool), block_mask], dim=1)
    out = F.scaled_dot_product_attention(query.float(), k.float(), v.float(), attn_mask=mask, scale=0.125)
    return out.transpose(1, 2).reshape(1, q_len, -1)


@pytest.mark.parametrize("committed", [0, 1, 37, 300])
@pytest.mark.parametrize("q_len", [1, 2, 9])
@pytest.mark.parametrize("kv_heads", [1, 3, 9])
def test_attend_matches_reference(committed: int, q_len: int, kv_heads: int) -> None:
    torch.manual_seed(committed * 100 + q_len)
    query = torch.randn(1, 9, q_len, 64)
    keys, values = torch.randn(1, kv_heads, committed + q_len, 64), torch.randn(1, kv_heads, committed + q_len, 64)
    block = torch.ones(q_len, q_len, dtype=torch.bool).tril()
    if q_len == 9:  # a branching trie: node i sees its ancestors only
        parents = [-1, 0, 0, 1, 1, 2, 3, 3, 6]
        block = torch.zeros(9, 9, dtype=torch.bool)
        for node, parent in enumerate(parents):
            block[node] = block[parent] if parent >= 0 else block[node]
            block[node, node] = True
    if committed == 0 and q_len == 1:
        return
    out = attend(query, keys, values, committed=committed, block_mask=block, scaling=0.125)
    expected = reference(query, keys, values, committed, block)
    torch.testing.assert_close(out, expected, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("committed", [64, 101])  # 101: chunks of unequal size leave a remainder
@pytest.mark.parametrize("q_len", [1, 5])
def test_split_kv_over_threads_matches_reference(monkeypatch: pytest.MonkeyPatch, committed: int, q_len: int) -> None:
    monkeypatch.setattr(attention, "SPLIT_KV_MIN", 16)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        torch.manual_seed(committed + q_len)
        query = torch.randn(1, 9, q_len, 64)
        keys, values = torch.randn(1, 3, committed + q_len, 64), torch.randn(1, 3, committed + q_len, 64)
        block = torch.ones(q_len, q_len, dtype=torch.bool).tril()
        out = attend(query, keys, values, committed=committed, block_mask=block, scaling=0.125)
    finally:
        torch.set_num_threads(threads)
    torch.testing.assert_close(out, reference(query, keys, values, committed, block), atol=2e-5, rtol=1e-4)


def test_split_kv_gives_the_same_bits_on_any_number_of_threads() -> None:
    # A prefill past SPLIT_KV_MIN positions: its chunks must not depend on the threads, or a run's
    # text from a long prefix would depend on --threads (it did: a chunk count per thread).
    torch.manual_seed(0)
    query = torch.randn(1, 9, 8, 64)
    keys, values = torch.randn(1, 3, 5000 + 8, 64), torch.randn(1, 3, 5000 + 8, 64)
    threads, outs = torch.get_num_threads(), []
    try:
        for count in (1, 2, 3):
            torch.set_num_threads(count)
            outs.append(attend(query, keys, values, committed=5000, block_mask=None, scaling=0.125))
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


def test_split_and_masked_agree_in_bfloat16() -> None:
    torch.manual_seed(0)
    q_len, committed = 7, 500
    query = torch.randn(1, 9, q_len, 64, dtype=torch.bfloat16)
    keys = torch.randn(1, 3, committed + q_len, 64, dtype=torch.bfloat16)
    values = torch.randn(1, 3, committed + q_len, 64, dtype=torch.bfloat16)
    block = torch.ones(q_len, q_len, dtype=torch.bool).tril()
    packed = pack_queries(query, 3)
    split = split_attention(packed, keys, values, committed=committed, block_mask=block, scaling=0.125)
    masked = masked_attention(packed, keys, values, committed=committed, block_mask=block, scaling=0.125)
    torch.testing.assert_close(split.float(), masked.float(), atol=2e-2, rtol=2e-2)


def _forward_pair(family: str, q_len: int, tree: bool):  # type: ignore[no-untyped-def]
    lean = tiny_target(family)
    stock = Target(lean.model, lean=False)
    assert lean.lean and not stock.lean
    prompt = torch.randint(2, 90, (40,), generator=torch.Generator().manual_seed(2))
    outs = []
    for target in (lean, stock):
        cache = FullCache(target.num_layers, capacity=64)
        target.forward(prompt, cache)
        cache.commit(range(40))
        block = depths = None
        if tree:
            trie = build_tree(7, [[3, 4], [5, 6]])
            tokens, block, depths = trie.tokens, trie.mask, trie.depths
        else:
            tokens = torch.arange(3, 3 + q_len)
        outs.append(target.forward(tokens, cache, depths=depths, block_mask=block))
    return outs


@pytest.mark.parametrize("family", ["llama-mha", "llama-gqa", "qwen2", "mistral"])
@pytest.mark.parametrize(("q_len", "tree"), [(1, False), (6, False), (0, True)], ids=["one", "causal", "tree"])
def test_lean_forward_matches_stock(family: str, q_len: int, tree: bool) -> None:
    lean, stock = _forward_pair(family, q_len, tree)
    torch.testing.assert_close(lean.hidden, stock.hidden, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(lean.pre_norm, stock.pre_norm, atol=1e-4, rtol=1e-4)


def test_sliding_window_models_take_the_stock_path() -> None:
    from conftest import tiny_config
    from transformers import AutoModelForCausalLM

    config = tiny_config("mistral")
    config.sliding_window = 16
    assert not Target(AutoModelForCausalLM.from_config(config)).lean
