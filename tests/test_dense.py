"""The row-exact dense products: a row's bits alone whatever the batch, on the kernels and in torch; a
bfloat16 model at real widths writes plain decoding's text with TokenSwift."""

from __future__ import annotations

import pytest
import torch
from helpers import first_divergence, random_heads, random_prompt
from transformers import AutoModelForCausalLM, Qwen2Config

from tokenswift_cli.backends.cpu import dense, kernels
from tokenswift_cli.config import DraftConfig, RunConfig, SamplingConfig
from tokenswift_cli.engine.decode import generate_tokens
from tokenswift_cli.model.target import Target

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
SHAPES = [(64, 128), (1536, 576), (4096, 72), (37, 23)]  # 1536 -> 576: the embedded model's down_proj


@pytest.fixture(params=["kernels", "torch"])
def products(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "kernels" and not kernels.available():
        pytest.skip("no C++ kernels")
    if request.param == "torch":
        monkeypatch.setattr(dense, "_kernels", lambda: None)
    return str(request.param)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("features", "out"), SHAPES)
def test_a_linear_row_gets_its_bits_alone_whatever_the_batch(
    products: str, dtype: torch.dtype, features: int, out: int
) -> None:
    generator = torch.Generator().manual_seed(features)
    weight = torch.randn(out, features, generator=generator).to(dtype)
    bias = torch.randn(out, generator=generator).to(dtype)
    x = torch.randn(40, features, generator=generator).to(dtype)
    alone = torch.cat([dense.linear(x[i : i + 1], weight, bias) for i in range(40)])
    for rows in (*range(1, 18), 23, 31, 40):
        assert torch.equal(dense.linear(x[:rows], weight, bias), alone[:rows]), rows
    reference = x.double() @ weight.double().T + bias.double()
    tolerance = {torch.float32: 1e-4, torch.float16: 0.1, torch.bfloat16: 1.0}[dtype]  # the output's rounding
    assert (alone.double() - reference).abs().max() < tolerance


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_row_and_column_products_keep_a_rows_bits_and_compute_the_product(products: str, dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(2)
    x, w = torch.randn(3, 20, 64, generator=generator).to(dtype), torch.randn(3, 256, 64, generator=generator).to(dtype)
    v = torch.randn(3, 64, 70, generator=generator).to(dtype)
    rows = dense.row_products(x, w)  # [3, 20, 256]
    columns = dense.column_products(x, v)  # [3, 20, 70]
    for r in range(20):
        assert torch.equal(dense.row_products(x[:, r : r + 1], w), rows[:, r : r + 1])
        assert torch.equal(dense.column_products(x[:, r : r + 1], v), columns[:, r : r + 1])
    torch.testing.assert_close(rows.double(), x.double() @ w.double().transpose(1, 2), atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(columns.double(), x.double() @ v.double(), atol=1e-4, rtol=1e-5)
    # one group of rows for every group of weights; strided weights
    shared = dense.row_products(x[:1], w)
    assert torch.equal(shared[1], dense.row_products(x[:1], w[1:2])[0])
    assert torch.equal(dense.row_products(x, w[:, ::2]), dense.row_products(x, w[:, ::2].contiguous()))


def test_the_gated_mlp_runs_through_the_row_exact_linear_layers() -> None:
    model = AutoModelForCausalLM.from_config(_real_width_config(layers=1)).eval()
    mlp, x = model.model.layers[0].mlp, torch.randn(5, 1536)
    with torch.no_grad():
        torch.testing.assert_close(dense.apply(mlp, x), mlp(x), atol=1e-4, rtol=1e-4)
        assert torch.equal(dense.apply(mlp, x)[2:3], dense.apply(mlp, x[2:3]))


def _real_width_config(layers: int = 2) -> Qwen2Config:
    """Qwen2.5-1.5B's widths (hidden 1536, 12 query / 2 KV heads of 128, MLP 4096 here) with few layers and ids."""
    return Qwen2Config(
        vocab_size=96, hidden_size=1536, intermediate_size=4096, num_hidden_layers=layers, num_attention_heads=12,
        num_key_value_heads=2, max_position_embeddings=4096, tie_word_embeddings=False, bos_token_id=0,
        eos_token_id=None, pad_token_id=None,
    )  # fmt: skip


@pytest.mark.parametrize("sampling", [SamplingConfig(), SamplingConfig(temperature=1.0, min_p=0.05, seed=3)],
                         ids=["greedy", "sampling"])  # fmt: skip
def test_bfloat16_tokenswift_equals_plain_at_real_widths(sampling: SamplingConfig) -> None:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(_real_width_config(), attn_implementation="sdpa").eval()
    with torch.no_grad():
        model.get_output_embeddings().weight.normal_(0.0, 0.05)  # a sharper distribution than random's
    target = Target(model.to(torch.bfloat16))
    heads, prompt = random_heads(target).to(torch.bfloat16), random_prompt(40)
    cfg = RunConfig(max_new_tokens=48, sampling=sampling, prefill_chunk=32)
    plain, _ = generate_tokens(target, None, prompt, cfg.replace(mode="plain"))
    fast, stats = generate_tokens(target, heads, prompt, cfg.replace(draft=DraftConfig(tree=(1, 3, 3))))
    assert first_divergence(fast, plain) is None
    assert stats.iterations < len(plain)
