"""The padded (CUDA) backend, forced onto the CPU: its rows do not depend on the rows beside them, and
TokenSwift through it writes plain decoding's text, eagerly and through the static-shape body that CUDA
graphs capture (run uncaptured here). The same checks run on a GPU in test_gpu.py."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_model
from helpers import first_divergence, random_heads, random_prompt
from padded_checks import GREEDY, SEEDED, WINDOW, chain_rows_differing, tokenswift_equals_plain, tree_rows_differing

from tokenswift_cli.backends.cuda.float64_attention import float64_attention
from tokenswift_cli.backends.cuda.graphs import GRAPHS, SPAN_STEP, StepGraphs
from tokenswift_cli.backends.cuda.padded import FORCE, PaddedBackend
from tokenswift_cli.backends.lean import LeanBackend
from tokenswift_cli.config import DraftConfig, RunConfig, SamplingConfig
from tokenswift_cli.engine.decode import generate_tokens
from tokenswift_cli.engine.tree import build_tree
from tokenswift_cli.model.attention import attend
from tokenswift_cli.model.target import Target

TREE = build_tree(5, [(1, 2, 3), (4, 5), (6, 7)], [(9, 9, 9, 9, 9)])  # 1 + 3 + 6 + 12 + 5 nodes


@pytest.fixture(params=["0", "body"], ids=["eager", "graph-body"])
def forced(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    monkeypatch.setenv(FORCE, "1")
    monkeypatch.setenv(GRAPHS, request.param)


def padded(family: str, dtype: torch.dtype, rows: int | None = None) -> Target:
    target = Target(tiny_model(family).to(dtype))
    assert isinstance(target.backend, PaddedBackend)
    if rows is not None:
        target.backend.rows = rows
        if target.backend.graphs is not None:
            target.backend.graphs = StepGraphs(target.backend, rows=rows, exact=True, capture=False)
    return target


def test_the_padded_backend_is_taken_on_cuda_or_when_forced(monkeypatch: pytest.MonkeyPatch) -> None:
    assert type(Target(tiny_model("qwen2")).backend) is LeanBackend  # a CPU, not forced
    monkeypatch.setenv(FORCE, "1")
    assert type(Target(tiny_model("qwen2")).backend) is PaddedBackend
    assert not isinstance(Target(tiny_model("qwen2"), lean=False).backend, PaddedBackend)


@pytest.mark.usefixtures("forced")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_rows_1_to_70_get_the_bits_of_one_row_forwards(family: str, dtype: torch.dtype) -> None:
    assert chain_rows_differing(padded(family, dtype), 70) == []  # 70: two pieces of 64 rows


@pytest.mark.usefixtures("forced")
@pytest.mark.parametrize("rows", [64, 8])  # 8: the tree's 27 nodes in four pieces
def test_a_verified_tree_gives_each_node_the_bits_of_its_path_decoded(family: str, rows: int) -> None:
    assert tree_rows_differing(padded(family, torch.bfloat16, rows), TREE) == []


@pytest.mark.usefixtures("forced")
@pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["greedy", "seeded"])
@pytest.mark.parametrize("window", [None, WINDOW], ids=["full", "window"])
def test_tokenswift_through_the_padded_backend_equals_plain(family: str, sampling, window) -> None:  # type: ignore[no-untyped-def]
    target = padded(family, torch.bfloat16)
    divergence, iterations, tokens = tokenswift_equals_plain(target, sampling, window=window)
    assert divergence is None and iterations < tokens
    graphs = target.backend.graphs
    if graphs is not None:  # the graph bodies ran the verifications and the draft passes (none under a window)
        assert bool(graphs.captured) == bool(target.backend.draft_graphs.captured) == (window is None)


def test_draft_passes_on_the_partial_cache_run_the_graph_body(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FORCE, "1")
    monkeypatch.setenv(GRAPHS, "body")
    target = padded("llama-gqa", torch.bfloat16)
    heads = random_heads(target).to(dtype=target.dtype)
    draft = DraftConfig(tree=(1, 3, 3, 3), partial_budget=64, sink_tokens=4, recent_window=16)
    cfg = RunConfig(max_new_tokens=120, sampling=SEEDED, prefill_chunk=32, draft=draft)
    prompt = random_prompt(150)
    fast, stats = generate_tokens(target, heads, prompt, cfg)
    plain, _ = generate_tokens(target, None, prompt, cfg.replace(mode="plain"))
    assert first_divergence(fast, plain) is None and stats.iterations < len(plain)
    assert [span for span, _ in target.backend.draft_graphs.captured] == [65]  # the partial cache's capacity


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_the_graph_body_writes_the_eager_text(
    family: str, sampling: SamplingConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Across spans (one graph per `SPAN_STEP` keys; the last one ends at the cache's capacity)."""
    monkeypatch.setenv(FORCE, "1")
    prompt = random_prompt(SPAN_STEP - 100)
    cfg = RunConfig(max_new_tokens=150, sampling=sampling, prefill_chunk=256, mode="plain")
    texts = {}
    for mode in ("0", "body"):
        monkeypatch.setenv(GRAPHS, mode)
        target = padded(family, torch.bfloat16)
        texts[mode] = generate_tokens(target, None, prompt, cfg)[0]
    spans, attending = zip(*sorted(target.backend.graphs.captured), strict=True)
    assert spans[0] == SPAN_STEP and SPAN_STEP < spans[1] <= 2 * SPAN_STEP and len(spans) == 2
    assert attending == (1, 1)  # plain steps attend their one row
    assert first_divergence(texts["body"], texts["0"]) is None


@pytest.mark.usefixtures("forced")
def test_tokenswift_equals_plain_when_trees_outgrow_a_piece() -> None:
    divergence, _, _ = tokenswift_equals_plain(padded("llama-gqa", torch.bfloat16, rows=8), SEEDED, tokens=120)
    assert divergence is None


def test_float64_attention_is_attention() -> None:
    torch.manual_seed(0)
    committed, size = 300, TREE.size
    query = torch.randn(1, 6, size, 32)
    keys, values = torch.randn(1, 2, committed + size, 32), torch.randn(1, 2, committed + size, 32)
    got = float64_attention(
        query, keys[:, :, :committed], values[:, :, :committed], keys[:, :, committed:], values[:, :, committed:],
        tree_visible=TREE.mask, scaling=0.2,
    )  # fmt: skip
    expected = attend(query, keys, values, committed=committed, block_mask=TREE.mask, scaling=0.2)
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-4)
