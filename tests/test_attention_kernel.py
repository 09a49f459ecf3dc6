"""The Triton kernels (`backends/cuda/attention_kernel.py`, `layer_kernels.py`) in Triton's interpreter on this
CPU: the attention gives `float64_attention`'s bits in bfloat16, float16 and float32, with the tree block,
a cache mask, sinks and a held count read from a device tensor; the fused norm, rotation and activation
compute what the torch ops do, each row alone; and the padded backend through them keeps every row's
bits and writes plain decoding's text. On a GPU the same checks run compiled (test_gpu.py)."""

from __future__ import annotations

import pytest
import torch
from conftest import LOGIT_SCALE, tiny_config
from padded_checks import SEEDED, WINDOW, chain_rows_differing, tokenswift_equals_plain, tree_rows_differing
from transformers import AutoModelForCausalLM

from tokenswift_cli.backends.cuda import attention_kernel
from tokenswift_cli.backends.cuda.attention_kernel import kernel_attention, splits_for
from tokenswift_cli.backends.cuda.float64_attention import float64_attention
from tokenswift_cli.backends.cuda.graphs import GRAPHS, StepGraphs
from tokenswift_cli.backends.cuda.padded import ATTENTION, FORCE, PaddedBackend
from tokenswift_cli.engine.tree import build_tree
from tokenswift_cli.model.target import Target

pytestmark = pytest.mark.skipif(not attention_kernel.available(), reason="needs triton (make install has it)")
TREE = build_tree(5, [(1, 2, 3), (4, 5)], [(9, 9, 9)])  # 1 + 3 + 6 + 3 nodes
DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def _case(dtype: torch.dtype, *, heads: int, kv: int, dim: int, held: int, rows: int, seed: int):  # type: ignore[no-untyped-def]
    generator = torch.Generator().manual_seed(seed)
    capacity = held + rows + 37  # never-written slots past the block: the kernels must not read them

    def draw(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=generator) * 2).to(dtype)

    keys, values = draw(1, kv, capacity, dim), draw(1, kv, capacity, dim)
    keys[:, :, held + rows :] = float("nan")
    values[:, :, held + rows :] = float("nan")
    return draw(1, heads, rows, dim), draw(1, heads, rows, dim), keys, values


def _reference(query, keys, values, held, rows, **options):  # type: ignore[no-untyped-def]
    cache_k, cache_v = keys[:, :, :held], values[:, :, :held]
    tree_k, tree_v = keys[:, :, held : held + rows], values[:, :, held : held + rows]
    return float64_attention(query, cache_k, cache_v, tree_k, tree_v, **options)


@pytest.mark.parametrize("dot", [False, True], ids=["registers", "dot"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("heads", "kv", "dim"), [(4, 4, 16), (6, 2, 32), (9, 3, 24)], ids=["mha", "gqa", "dim24"])
def test_the_kernels_give_float64_attentions_bits(dtype: torch.dtype, heads: int, kv: int, dim: int, dot: bool) -> None:
    held, rows = 300, TREE.size
    query, _, keys, values = _case(dtype, heads=heads, kv=kv, dim=dim, held=held, rows=rows, seed=heads + dim)
    expected = _reference(query, keys, values, held, rows, tree_visible=TREE.mask, scaling=0.3)
    got = kernel_attention(query, keys, values, torch.tensor(held), tree_visible=TREE.mask, scaling=0.3, dot=dot)
    assert got.dtype == dtype and torch.equal(got, expected)


@pytest.mark.parametrize("dot", [False, True], ids=["registers", "dot"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_a_cache_mask_and_sinks_as_under_a_context_window(dtype: torch.dtype, dot: bool) -> None:
    held, rows = 200, TREE.size
    query, sink_query, keys, values = _case(dtype, heads=6, kv=2, dim=16, held=held, rows=rows, seed=1)
    generator = torch.Generator().manual_seed(2)
    cache_visible = torch.rand(rows, held, generator=generator) < 0.6
    cache_visible[:, :4] = True
    options = {
        "tree_visible": TREE.mask, "scaling": 0.25, "cache_visible": cache_visible, "sink_query": sink_query,
        "cache_sinks": 4, "tree_sinks": torch.arange(rows) < 2,
    }  # fmt: skip
    expected = _reference(query, keys, values, held, rows, **options)
    assert torch.equal(kernel_attention(query, keys, values, held, dot=dot, **options), expected)  # type: ignore[arg-type]


def test_a_rows_bits_do_not_depend_on_the_rows_beside_it_or_the_splits(monkeypatch: pytest.MonkeyPatch) -> None:
    held, rows = 330, 24
    query, _, keys, values = _case(torch.bfloat16, heads=8, kv=2, dim=16, held=held, rows=rows, seed=5)
    causal = torch.ones(rows, rows, dtype=torch.bool).tril()
    together = kernel_attention(query, keys, values, held, tree_visible=causal, scaling=0.2)
    for row in (0, 11, 23):  # the same row alone, its own keys visible to it as a one-row forward sees them
        alone = kernel_attention(
            query[:, :, row : row + 1], keys, values, held, tree_visible=causal[row : row + 1], scaling=0.2
        )
        assert torch.equal(alone[0, 0], together[0, row])
    for splits in (1, 3, 7):  # another split of the held keys: the same bits
        monkeypatch.setattr(attention_kernel, "splits_for", lambda *_, n=splits: n)
        assert torch.equal(kernel_attention(query, keys, values, held, tree_visible=causal, scaling=0.2), together)


def test_the_padded_backend_checks_the_kernels_before_relying_on_them() -> None:
    from tokenswift_cli.backends.cuda import layer_kernels

    assert attention_kernel.agrees(torch.device("cpu"), torch.bfloat16) is None
    assert layer_kernels.usable(torch.device("cpu"), torch.bfloat16) is None


def test_splits_fill_the_gpu_without_splitting_short_caches() -> None:
    assert splits_for(100, kv_heads=8, row_blocks=1) == 1
    assert splits_for(1 << 17, kv_heads=8, row_blocks=1) == attention_kernel.TARGET_PROGRAMS // 8
    assert splits_for(1 << 17, kv_heads=8, row_blocks=16) == 2


@pytest.fixture
def through_the_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FORCE, "1")
    monkeypatch.setenv(ATTENTION, "kernel")


def kernel_target(family: str) -> Target:
    """A tiny model with 32-wide heads (so the fused layer kernels apply too), in bfloat16, through the kernels."""
    config = tiny_config(family)
    config.num_attention_heads, config.num_key_value_heads, config.head_dim = 2, 1, 32
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        model.get_output_embeddings().weight.normal_(0.0, LOGIT_SCALE)
    target = Target(model.to(torch.bfloat16))
    backend = target.backend
    assert isinstance(backend, PaddedBackend) and backend.kernel_attention and backend.fused_layers
    backend.rows = 8  # interpreted kernels cost per row: pieces of 8 rows (a tree of more takes several)
    if backend.graphs is not None:
        backend.graphs = StepGraphs(backend, rows=8, exact=True, capture=False)
    return target


@pytest.mark.usefixtures("through_the_kernels")
def test_the_padded_backend_through_the_kernels_keeps_each_rows_bits(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv(GRAPHS, "body")  # (the eager pieces: under the context window below)
    target = kernel_target("llama-gqa")
    assert chain_rows_differing(target, 4, prompt_length=12) == []
    assert tree_rows_differing(target, build_tree(5, [(1, 2), (4,)]), prompt_length=12) == []


@pytest.mark.usefixtures("through_the_kernels")
def test_tokenswift_through_the_kernels_equals_plain(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The graph body, and (under a context window, sinks and all) the eager pieces: slow when interpreted,
    so a short run each; the GPU tests run longer ones compiled."""
    monkeypatch.setenv(GRAPHS, "body")
    for window, tokens in ((None, 14), (WINDOW, 10)):
        target = kernel_target("qwen2")
        divergence, iterations, _ = tokenswift_equals_plain(target, SEEDED, window=window, tokens=tokens)
        assert divergence is None and iterations < tokens
        drafted = target.backend.draft_graphs.captured  # the draft passes ran the fused body with the kernels
        assert bool(drafted) == (window is None)


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_fused_layer_pieces_compute_the_torch_ops_row_by_row(dtype: torch.dtype) -> None:
    from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm, apply_rotary_pos_emb

    from tokenswift_cli.backends.cuda import layer_kernels

    torch.manual_seed(0)
    config = tiny_config("llama-gqa")
    norm, mlp = LlamaRMSNorm(64, eps=1e-5), LlamaMLP(config)
    with torch.no_grad():
        norm.weight.normal_(1.0, 0.2)
    norm, mlp = norm.to(dtype), mlp.to(dtype)
    x, delta = torch.randn(1, 10, 64).to(dtype), torch.randn(1, 10, 64).to(dtype)
    tolerance = {"atol": 2e-2, "rtol": 2e-2} if dtype != torch.float32 else {"atol": 1e-5, "rtol": 1e-5}
    normed, total = layer_kernels.rms_norm(norm, x, delta)
    torch.testing.assert_close(total, x + delta, **tolerance)
    torch.testing.assert_close(normed, norm(x + delta), **tolerance)
    torch.testing.assert_close(layer_kernels.mlp(mlp, normed), mlp(normed), **tolerance)
    heads, positions = torch.randn(1, 10, 2, 32).to(dtype), torch.arange(10)[:, None].float()
    angles = torch.cat([positions * torch.linspace(0.01, 1, 16)] * 2, dim=-1)[None]
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
    expected, _ = apply_rotary_pos_emb(heads.transpose(1, 2), heads.transpose(1, 2), cos, sin)
    torch.testing.assert_close(layer_kernels.rotate(heads, cos, sin), expected, **tolerance)
    for row in (0, 7):  # a row alone gets the bits it gets among ten
        alone = layer_kernels.rms_norm(norm, x[:, row : row + 1], delta[:, row : row + 1])[0]
        assert torch.equal(alone[0, 0], normed[0, row])
        assert torch.equal(layer_kernels.rotate(heads[:, row : row + 1], cos[:, row : row + 1],
                                                sin[:, row : row + 1])[0, :, 0], layer_kernels.rotate(
            heads, cos, sin)[0, :, row])  # fmt: skip
