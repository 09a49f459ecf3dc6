"""The decoder layers in one C++ call (native_decoder.py): the Python lean forward's bits, and
TokenSwift == plain through it, for fused and unfused 4-bit projections, with and without a window."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_config
from helpers import assert_windowed_sampling_is_lossless, random_prompt
from transformers import AutoModelForCausalLM, LlamaConfig

from tokenswift_cli import kernels
from tokenswift_cli.config import ContextWindow, RunConfig
from tokenswift_cli.int4 import quantize_decoder
from tokenswift_cli.state import prefill
from tokenswift_cli.target import QueryCapture, Target
from tokenswift_cli.tree import build_tree

pytestmark = pytest.mark.skipif(not kernels.available(), reason="no C++ compiler for the kernels")
TREE = build_tree(0, [(1, 2, 3), (4, 5), (6, 7)])  # 22 nodes: more than EXACT_ROWS, so products split


def _model(kind: str) -> torch.nn.Module:
    """4-bit tiny models the native decoder takes: q/k/v fused (llama MHA, qwen2 with its biases) or not (GQA)."""
    if kind == "llama-mha":
        config = tiny_config("llama-mha")  # head size 16, k/v 64 outputs wide: fused
    elif kind == "llama-gqa":
        config = LlamaConfig(**{**tiny_config("llama-mha").to_dict(), "num_key_value_heads": 2})  # k/v 32: unfused
    else:
        config = tiny_config("qwen2")
        config.hidden_size, config.intermediate_size = 128, 256  # head size 32, k/v 64 wide: fused, with biases
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()
    with torch.no_grad():
        model.get_output_embeddings().weight.normal_(0.0, 0.35)
        for name, parameter in model.named_parameters():
            if "norm" in name:  # not all ones: a norm's weight must be applied as the module applies it
                parameter.normal_(1.0, 0.2)
    quantize_decoder(model)
    return model


@pytest.mark.parametrize("kind", ["llama-mha", "llama-gqa", "qwen2"])
@pytest.mark.parametrize("window", [None, ContextWindow(size=64, sinks=4)], ids=["full", "window"])
def test_native_decoder_gives_the_python_forwards_bits(kind: str, window: ContextWindow | None) -> None:
    target = Target(_model(kind))
    native = target.native
    assert native is not None
    state = prefill(target, random_prompt(150), RunConfig(max_new_tokens=8, mode="plain", window=window))
    cache = state.full
    chain = torch.tensor(random_prompt(3, seed=4))
    for tokens, depths, mask in ((chain[:1], None, None), (TREE.tokens, TREE.depths, TREE.mask)):
        results = []
        for use in (native, None):
            target.native = use
            capture = QueryCapture(row=0)
            out = target.forward(tokens, cache, depths=depths, block_mask=mask, capture=capture, exact=True)
            layer = cache.layer_list[-1]
            written = (layer.keys[0, :, layer.stored :][:, : len(tokens)].clone(),
                       layer.values[0, :, layer.stored :][:, : len(tokens)].clone())  # fmt: skip
            results.append((out.hidden, out.pre_norm, torch.stack(capture.ordered()), *written))
        for got, expected in zip(*results, strict=True):
            assert torch.equal(got, expected)


@pytest.mark.parametrize("kind", ["llama-gqa", "qwen2"])
def test_tokenswift_equals_plain_through_the_native_decoder(kind: str) -> None:
    target = Target(_model(kind))
    assert target.native is not None
    assert_windowed_sampling_is_lossless(target)
