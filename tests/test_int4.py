"""4-bit weights: the GGUF's own Q4 groups are found exactly, the products follow their documented order, rows do
not depend on their batch, and lossless holds."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import tiny_model
from helpers import first_divergence, random_heads, random_prompt

from tokenswift_cli.backends.cpu import kernels
from tokenswift_cli.backends.cpu.int4 import GROUP, LANES, Int4Linear, is_q4, pack, quantize_decoder, unpack
from tokenswift_cli.config import ContextWindow, ModelSpec, RunConfig, SamplingConfig
from tokenswift_cli.engine.decode import generate_tokens
from tokenswift_cli.model.loading import load_model, parameter_count
from tokenswift_cli.model.target import Target

pytestmark = pytest.mark.skipif(not kernels.available(), reason="no C++ kernels")


def q4_linear(out_features: int, in_features: int, seed: int = 0) -> torch.nn.Linear:
    """A linear layer whose weights are de-quantised Q4_1 groups: m + d * q, float16 d and m, as gguf computes them."""
    generator = torch.Generator().manual_seed(seed)
    groups = in_features // GROUP
    d = (torch.rand(out_features, groups, 1, generator=generator) * 0.02 + 0.001).half().float()
    m = (-torch.rand(out_features, groups, 1, generator=generator) * 0.2).half().float()
    q = torch.randint(0, 16, (out_features, groups, GROUP), generator=generator).float()
    q[..., 0], q[..., 1] = 0, 15  # llama.cpp's quantiser maps a group's min to 0 and its max to 15
    linear = torch.nn.Linear(in_features, out_features, bias=False)
    with torch.no_grad():
        linear.weight.copy_((d * q + m).view(out_features, in_features))
    return linear


def test_q4_groups_are_found_exactly_and_other_weights_are_quantised() -> None:
    linear = q4_linear(48, 96)
    layer, exact = Int4Linear.from_linear(linear)
    assert exact
    assert torch.equal(layer.dense_weight(), linear.weight)  # the GGUF's own d, m and q
    dense = torch.nn.Linear(96, 48, bias=False)
    rough, exact = Int4Linear.from_linear(dense)
    assert not exact
    step = (dense.weight.view(48, 3, GROUP).amax(-1) - dense.weight.view(48, 3, GROUP).amin(-1)) / 15
    error = (rough.dense_weight() - dense.weight).abs().view(48, 3, GROUP).amax(-1)
    assert bool((error <= step / 2 + 2e-3).all())  # within half a step (+ the float16 scales)


@pytest.mark.parametrize("shape", [(5, 32), (12, 96), (64, 576)])
def test_packing_round_trips(shape: tuple[int, int]) -> None:
    q = torch.randint(0, 16, shape, generator=torch.Generator().manual_seed(shape[0]))
    assert torch.equal(unpack(pack(q), shape), q.to(torch.int32))


def quantised_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """quantised_products.cpp's quantisation: per group of 32, dx = max |x| / 127, xq = round(x * (1 / dx)) (to
    nearest even) -> (xq [R, G, 32], dx [R, G], dx * sum of xq [R, G])."""
    groups = x.float().view(x.shape[0], -1, GROUP)
    dx = groups.abs().amax(-1) / 127
    inverse = torch.where(dx != 0, 1 / torch.where(dx != 0, dx, torch.ones_like(dx)), torch.zeros_like(dx))
    xq = (groups * inverse[..., None]).round().clamp(-127, 127)
    return xq, dx, dx * xq.sum(-1)


def products_reference(
    x: torch.Tensor, q: torch.Tensor, d: torch.Tensor, m: torch.Tensor | None = None
) -> torch.Tensor:
    """quantised_products.cpp's documented order, emulated, for levels q [out, in], scales d and offsets m
    [out, groups] (none for Q8_0): per chunk of 16 groups, acc = fma(m, dx * sum xq, acc) lane by group,
    then per pair of groups acc = fma(sums of 4 products, d * dx, acc) with lanes 0-7 / 8-15 on groups 2p /
    2p + 1; lanes folded l + (l + 8), + 4, + 2, + 1. A fused a * b + c is exact in float64 before its one
    rounding to float32 (but for a rare double rounding)."""

    def fma(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        return (a.double() * b.double() + c.double()).float()

    xq, dx, offset = quantised_activations(x)
    groups, outputs = dx.shape[1], q.shape[0]
    sums = (q.float().view(outputs, groups, GROUP)[None] * xq[:, None]).view(x.shape[0], outputs, groups, 8, 4).sum(-1)
    acc = torch.zeros(x.shape[0], outputs, LANES)
    lanes = torch.arange(LANES)
    for chunk in range(-(-groups // LANES)):
        if m is not None:
            in_chunk = (chunk * LANES + lanes).clamp(max=groups - 1)
            real = chunk * LANES + lanes < groups
            lows, offsets = torch.where(real, m[:, in_chunk], 0.0), torch.where(real, offset[:, in_chunk], 0.0)
            acc = fma(lows[None], offsets[:, None], acc)
        for first in range(chunk * LANES, min(groups, (chunk + 1) * LANES), 2):
            pair = torch.zeros(x.shape[0], outputs, LANES)
            scale = torch.zeros(x.shape[0], outputs, LANES)
            for half, g in enumerate((first, first + 1)):
                if g < groups:
                    pair[..., 8 * half : 8 * half + 8] = sums[:, :, g]
                    scale[..., 8 * half : 8 * half + 8] = (d[:, g][None] * dx[:, g][:, None])[..., None]
            acc = fma(pair, scale, acc)
    for width in (8, 4, 2, 1):
        acc = acc + acc[..., lanes ^ width]
    return acc[..., 0]


def q4_reference(x: torch.Tensor, layer: Int4Linear) -> torch.Tensor:
    """The layer's products in their documented order (`products_reference`), then its bias."""
    outputs, groups = layer.out_features, layer.in_features // GROUP
    q = unpack(layer.packed, (outputs, layer.in_features))
    d, m = layer.scales[:outputs, :groups].float(), layer.lows[:outputs, :groups].float()
    y = products_reference(x, q, d, m)
    return y + layer.bias if layer.bias is not None else y


@pytest.mark.parametrize("shape", [(64, 576), (37, 96), (20, 1536)])  # 18 groups (a partial chunk), 3 (odd), 48
def test_products_follow_their_documented_order_bit_for_bit(shape: tuple[int, int]) -> None:
    outputs, inputs = shape
    layer, _ = Int4Linear.from_linear(q4_linear(outputs, inputs, seed=outputs))
    x = torch.randn(9, inputs, generator=torch.Generator().manual_seed(1)) * 3
    x[2, :40] = 0  # a group of zeros: dx = 0
    expected = q4_reference(x, layer)
    for rows in (1, 2, 3, 9):  # the kernel's row tiles: one row (4 outputs at a time), 2, 3, 4 + 4 + 1
        got = layer(x[:rows])
        assert (got != expected[:rows]).sum() <= 1, "the products' arithmetic changed order on this CPU"


def test_rows_do_not_depend_on_the_batch_and_match_the_dense_product() -> None:
    layer, _ = Int4Linear.from_linear(q4_linear(64, 128, seed=1))
    x = torch.randn(40, 128, generator=torch.Generator().manual_seed(2))
    batch = layer(x)
    rows = torch.cat([layer(x[i : i + 1]) for i in range(40)])
    assert torch.equal(batch, rows) and batch.dtype == torch.float32
    for size in (1, 3, 16, 17, 28, 33):
        assert torch.equal(layer(x[:size]), batch[:size])
    xq, dx, _ = quantised_activations(x)  # the activations at 8 bits: the product up to float32 rounding
    reference = (xq * dx[..., None]).view(40, 128).double() @ layer.dense_weight().double().t()
    torch.testing.assert_close(batch, reference.float(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(batch, x @ layer.dense_weight().t(), atol=0.05, rtol=0.02)  # 8-bit activations


def test_bias_is_kept() -> None:
    linear = q4_linear(32, 64)
    with_bias = torch.nn.Linear(64, 32)
    with torch.no_grad():
        with_bias.weight.copy_(linear.weight)
    plain, _ = Int4Linear.from_linear(linear)
    biased, _ = Int4Linear.from_linear(with_bias)
    x = torch.randn(3, 64)
    torch.testing.assert_close(biased(x), plain(x) + with_bias.bias, atol=1e-6, rtol=0)


@pytest.mark.parametrize("window", [None, ContextWindow(size=64, sinks=4)], ids=["full", "window"])
@pytest.mark.parametrize("greedy", [True, False])
def test_tokenswift_equals_plain_on_int4_weights(family: str, greedy: bool, window: ContextWindow | None) -> None:
    model = tiny_model(family)
    done = quantize_decoder(model)
    assert done.layers == 7 * model.config.num_hidden_layers and done.exact == 0
    target = Target(model)
    heads, prompt = random_heads(target), random_prompt(60)
    sampling = SamplingConfig(temperature=0.0 if greedy else 1.0, min_p=0.05, seed=5)
    # 260 tokens cross the 256-position blocks of the float32 exact attention (exact_float32.py)
    cfg = RunConfig(max_new_tokens=260, sampling=sampling, window=window)
    plain, _ = generate_tokens(target, None, prompt, cfg.replace(mode="plain"))
    fast, stats = generate_tokens(target, heads, prompt, cfg)
    dense, _ = generate_tokens(Target(tiny_model(family)), None, prompt, cfg.replace(mode="plain"))
    assert first_divergence(fast, plain) is None
    assert stats.iterations < 260 and dense != plain  # the 4-bit model is another model


def test_auto_weights_are_int4_only_for_q4_models(tmp_path: Path) -> None:
    from cli_helpers import build_tiny_folder

    folder = build_tiny_folder(tmp_path / "tiny")
    dense = load_model(ModelSpec(name=str(folder), weights="auto"))
    assert dense.spec is not None and dense.spec.weights == "dense" and not is_q4(dense.model)
    forced = load_model(ModelSpec(name=str(folder), weights="int4"))
    assert forced.spec is not None and forced.spec.weights == "int4"
    assert isinstance(forced.model.model.layers[0].mlp.down_proj, Int4Linear)
    stored = sum(p.numel() for p in dense.model.parameters())
    assert parameter_count(forced.model) == parameter_count(dense.model) == stored
    model = dense.model
    with torch.no_grad():  # make the first block's weights Q4 groups: auto then chooses int4
        for module in model.model.layers[0].modules():
            if isinstance(module, torch.nn.Linear):
                module.weight.copy_(q4_linear(module.out_features, module.in_features).weight)
    assert is_q4(model)


@pytest.mark.parametrize("family", ["llama-mha", "llama-gqa"])
def test_fused_projections_give_the_bits_of_the_separate_ones(family: str) -> None:
    from tokenswift_cli.engine.state import prefill

    model = tiny_model(family)
    quantize_decoder(model)
    block = model.model.layers[0]
    assert hasattr(block.self_attn, "qkv_int4") and hasattr(block.mlp, "gate_up_int4")
    fused, mlp = block.mlp.gate_up_int4, block.mlp
    assert fused.splits == (mlp.gate_proj.out_features, mlp.up_proj.out_features)
    assert mlp.gate_proj.packed.data_ptr() == fused.packed.data_ptr()  # a view: stored once
    x = torch.randn(1, 5, model.config.hidden_size)
    together = fused(x).split(fused.splits, dim=-1)
    assert torch.equal(together[0], mlp.gate_proj(x)) and torch.equal(together[1], mlp.up_proj(x))
    target, prompt = Target(model), torch.tensor(random_prompt(40))

    def logits() -> torch.Tensor:
        state = prefill(target, [1, 2], RunConfig(max_new_tokens=8))
        return target.logits(target.forward(prompt, state.full).hidden)

    fused_logits = logits()
    for layer in model.model.layers:  # the lean forward without the fused modules: the same logits
        for module, name in ((layer.self_attn, "qkv_int4"), (layer.mlp, "gate_up_int4")):
            if hasattr(module, name):
                delattr(module, name)
    assert torch.equal(fused_logits, logits())


def test_without_the_kernels_the_model_stays_dense_and_int4_says_why(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from cli_helpers import build_tiny_folder

    from tokenswift_cli.model.loading import ModelLoadError

    folder = build_tiny_folder(tmp_path / "tiny")
    monkeypatch.setattr(kernels, "available", lambda: False)
    auto = load_model(ModelSpec(name=str(folder), weights="auto"))
    assert auto.spec is not None and auto.spec.weights == "dense"
    with pytest.raises(ModelLoadError, match="need the C\\+\\+ kernels"):
        load_model(ModelSpec(name=str(folder), weights="int4"))
