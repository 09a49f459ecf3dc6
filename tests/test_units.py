"""Unit tests of the engine's parts: trie, n-gram table, caches, sampler."""

from __future__ import annotations

import pytest
import torch
from helpers import random_prompt, tiny_target
from transformers import (
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from tokenswift_cli.config import ConfigError, DraftConfig, RunConfig, SamplingConfig
from tokenswift_cli.engine.ngram import NGramTable
from tokenswift_cli.engine.tree import TreeBuilder, build_tree
from tokenswift_cli.model.cache import FullCache, PartialCache
from tokenswift_cli.model.target import QueryCapture
from tokenswift_cli.sampling.distribution import choose, position_uniform, target_probs, target_scores

# --- trie -----------------------------------------------------------------------------------------


def test_trie_merges_shared_prefixes_and_builds_the_ancestor_mask() -> None:
    tree = build_tree(7, [(1, 2), (3, 4)], ngram_paths=[(1, 3, 9), (2, 5)])
    # template: 1-3, 1-4, 2-3, 2-4; n-grams add 1-3-9 (shares 1-3) and 2-5
    assert tree.size == 1 + 2 + 4 + 1 + 1
    assert tree.path_tokens(tree.size - 2) == [7, 1, 3, 9]
    assert tree.depths.tolist() == [0, 1, 2, 2, 1, 2, 2, 3, 2]
    for node in range(tree.size):
        ancestors = set()
        while node >= 0:
            ancestors.add(node)
            node = tree.parents[node]
        assert set(torch.nonzero(tree.mask[max(ancestors)]).flatten().tolist()) >= ancestors
    assert tree.mask.sum(1).tolist() == (tree.depths + 1).tolist()
    assert tree.from_ngram[tree.children[tree.children[0][1]][3]]  # 1-3 is also an n-gram prefix
    assert not tree.from_ngram[tree.children[tree.children[0][1]][4]]


def test_duplicate_paths_add_nothing() -> None:
    builder = TreeBuilder(0)
    for _ in range(3):
        builder.add((5, 6, 7))
    assert builder.build().size == 4


# --- n-grams --------------------------------------------------------------------------------------


def test_ngram_counts_order_and_rebuild() -> None:
    tokens = [1, 2, 3, 4, 1, 2, 3, 5, 1, 2, 3, 4, 9]
    table = NGramTable(4)
    table.update(tokens[:6], until=6)
    table.update(tokens, until=len(tokens))
    rebuilt = NGramTable(4)
    rebuilt.update(tokens, until=len(tokens))
    assert table.counts == rebuilt.counts
    assert table.top(1, 2) == [(2, 3, 4), (2, 3, 5)]  # 2 occurrences before 1
    assert table.top(42, 3) == []
    lagged = NGramTable(4)
    lagged.update(tokens, until=len(tokens) - 6)  # n-grams reaching into the last 6 tokens are left out
    assert lagged.top(1, 5) == [(2, 3, 4)]


# --- caches ---------------------------------------------------------------------------------------


def test_commit_compacts_accepted_nodes_like_a_fresh_forward() -> None:
    target = tiny_target("llama-gqa")
    prompt = random_prompt(20)
    cache = FullCache(target.num_layers, capacity=8)  # small: forces geometric growth too
    target.forward(torch.tensor(prompt), cache)
    cache.commit(range(len(prompt)))
    tree = build_tree(5, [(6, 7), (8, 9)])  # nodes: 0:5 1:6 2:8 3:9 4:7 5:8 6:9
    target.forward(tree.tokens, cache, depths=tree.depths, block_mask=tree.mask)
    path = [tree.children[0][7], tree.children[tree.children[0][7]][9]]
    cache.commit([0, *path])  # keep 5 -> 7 -> 9
    nxt = target.logits(target.forward(torch.tensor([11]), cache).hidden)

    fresh = FullCache(target.num_layers, capacity=64)
    target.forward(torch.tensor([*prompt, 5, 7, 9]), fresh)
    fresh.commit(range(len(prompt) + 3))
    expected = target.logits(target.forward(torch.tensor([11]), fresh).hidden)
    torch.testing.assert_close(nxt, expected, atol=1e-4, rtol=1e-4)
    assert cache.length == fresh.length == len(prompt) + 3


def test_partial_cache_selects_the_highest_scoring_keys_per_kv_head() -> None:
    layers, kv_heads, dim, n = 1, 2, 4, 40
    full = FullCache(layers, capacity=64)
    keys = torch.randn(1, kv_heads, n, dim) * 0.01
    keys[0, 0, [10, 20, 30], 0] = 5.0  # head 0 likes 10, 20, 30
    keys[0, 1, [11, 12, 13], 1] = 5.0  # head 1 likes 11, 12, 13
    full.layer_list[0].update(keys, keys.clone())
    full.commit(range(n))
    partial = PartialCache(layers, budget=2 + 3 + 8, sinks=2, window=8)
    query = torch.zeros(kv_heads * 2, dim)  # two query heads per KV head
    query[0:2, 0] = 1.0
    query[2:4, 1] = 1.0
    partial.refresh(full, [query])
    assert partial.selected[0][0].tolist() == [10, 20, 30]
    assert partial.selected[0][1].tolist() == [11, 12, 13]
    assert partial.window_start == n - 4
    assert partial.length == 2 + 3 + 4
    held = partial.layer_list[0].committed()[0]  # [1, kv_heads, 9, dim]
    torch.testing.assert_close(held[0, 0, 2:5], keys[0, 0, [10, 20, 30]])
    torch.testing.assert_close(held[0, 1, 5:], keys[0, 1, n - 4 :])


def test_query_capture_and_partial_draft_runs() -> None:
    target = tiny_target("qwen2")
    full = FullCache(target.num_layers, capacity=128)
    capture = QueryCapture(row=-1)
    target.forward(torch.tensor(random_prompt(100)), full, capture=capture)
    full.commit(range(100))
    assert len(capture.ordered()) == target.num_layers
    partial = PartialCache(target.num_layers, budget=40, sinks=4, window=16)
    partial.refresh(full, capture.ordered())
    out = target.forward(torch.tensor([3]), partial)
    assert out.hidden.shape[0] == 1 and partial.length == 40 - 8  # tentative token not committed


# --- sampling -------------------------------------------------------------------------------------


def test_position_uniform_is_keyed_by_seed_and_position() -> None:
    values = {position_uniform(s, p) for s in range(3) for p in range(100)}
    assert len(values) == 300 and all(0 < u < 1 for u in values)
    assert position_uniform(5, 17) == position_uniform(5, 17)


@pytest.mark.parametrize(
    "cfg, processor",
    [
        (SamplingConfig(temperature=1, top_k=5), TopKLogitsWarper(5)),
        (SamplingConfig(temperature=1, top_p=0.8), TopPLogitsWarper(0.8)),
        (SamplingConfig(temperature=1, min_p=0.1), MinPLogitsWarper(0.1)),
        (SamplingConfig(temperature=1, penalty=1.5, penalty_window=4), RepetitionPenaltyLogitsProcessor(1.5)),
    ],
)
def test_each_filter_matches_transformers(cfg: SamplingConfig, processor: object) -> None:
    torch.manual_seed(0)
    logits = torch.randn(50) * 3
    context = torch.tensor([1, 2, 3, 4, 5, 6])
    window = context[-cfg.penalty_window :] if cfg.penalty else context
    expected = processor(window[None], logits[None].clone())[0]  # type: ignore[operator]
    torch.testing.assert_close(target_scores(logits, context, cfg), expected)


def test_penalty_only_counts_the_window() -> None:
    logits = torch.zeros(10)
    logits[[1, 2]] = 2.0
    scores = target_scores(logits, torch.tensor([1, 5, 6, 2]), SamplingConfig(penalty=2.0, penalty_window=2))
    assert scores[2] == 1.0 and scores[1] == 2.0  # 2 is in the last two tokens, 1 is not


def test_inverse_cdf_draw_never_picks_a_filtered_token() -> None:
    logits = torch.tensor([3.0, 2.9, -5.0, -6.0, 0.0])
    cfg = SamplingConfig(temperature=1, min_p=0.3)
    probs = target_probs(logits, torch.tensor([0]), cfg)
    picks = {choose(logits, torch.tensor([0]), p, cfg) for p in range(300)}
    assert picks == {0, 1} and probs[2:].sum() == 0


def test_config_validation_messages() -> None:
    with pytest.raises(ConfigError, match="top-p"):
        SamplingConfig(top_p=1.5)
    with pytest.raises(ConfigError, match="partial budget"):
        DraftConfig(partial_budget=10, sink_tokens=4, recent_window=16)
    cfg = RunConfig(max_new_tokens=5, sampling=SamplingConfig(temperature=1, min_p=0.1), draft=DraftConfig(tree=(1, 2)))
    assert RunConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ConfigError, match="unknown KV cache"):
        RunConfig(max_new_tokens=5, kv_cache="int4")  # type: ignore[arg-type]
    recorded_before_the_option = {k: v for k, v in cfg.to_dict().items() if k != "kv_cache"}
    assert RunConfig.from_dict(recorded_before_the_option).kv_cache == "model"  # what such runs stored
