"""The decoder layers in one C++ call (native_decoder.py): the Python lean forward's bits, and
TokenSwift == plain through it, for fused and unfused 4-bit projections, with and without a window."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_config
from helpers import assert_windowed_sampling_is_lossless, random_prompt
from transformers import AutoModelForCausalLM, LlamaConfig

from tokenswift_cli.backends.cpu import kernels
from tokenswift_cli.backends.cpu.int4 import quantize_decoder
from tokenswift_cli.config import ConfigError, ContextWindow, RunConfig
from tokenswift_cli.engine.state import kv_storage, prefill
from tokenswift_cli.engine.tree import build_tree
from tokenswift_cli.model.target import QueryCapture, Target

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


STORED_AS = {"model": torch.float32, "float16": torch.float16, "int8": torch.uint8}  # int8: packed rows
# int8 rows come in groups of 32 values: the tiny qwen2's head size (the llama ones have 16)
KINDS_AND_STORAGE = [(k, c) for k in ("llama-mha", "llama-gqa", "qwen2") for c in ("model", "float16")] + [
    ("qwen2", "int8")
]


@pytest.mark.parametrize(("kind", "kv_cache"), KINDS_AND_STORAGE)
@pytest.mark.parametrize("window", [None, ContextWindow(size=64, sinks=4)], ids=["full", "window"])
def test_native_decoder_gives_the_python_forwards_bits(kind: str, window: ContextWindow | None, kv_cache: str) -> None:
    """Outputs, captured queries and the keys/values written (float16, int8: rounded alike) are the same bits."""
    target = Target(_model(kind))
    native = target.native
    assert native is not None
    cfg = RunConfig(max_new_tokens=8, mode="plain", window=window, kv_cache=kv_cache)  # type: ignore[arg-type]
    state = prefill(target, random_prompt(150), cfg)
    cache = state.full
    assert cache.layer_list[0].keys.dtype == STORED_AS[kv_cache]
    chain = torch.tensor(random_prompt(3, seed=4))
    for tokens, depths, mask in ((chain[:1], None, None), (TREE.tokens, TREE.depths, TREE.mask)):
        results = []
        for use in (native, None):
            target.backend.native = use
            capture = QueryCapture(row=0)
            out = target.forward(tokens, cache, depths=depths, block_mask=mask, capture=capture, exact=True)
            layer = cache.layer_list[-1]
            written = (layer.keys[0, :, layer.stored :][:, : len(tokens)].clone(),
                       layer.values[0, :, layer.stored :][:, : len(tokens)].clone())  # fmt: skip
            results.append((out.hidden, out.pre_norm, torch.stack(capture.ordered()), *written))
        for got, expected in zip(*results, strict=True):
            assert torch.equal(got, expected)


@pytest.mark.parametrize(
    ("kind", "kv_cache"), [("llama-gqa", "auto"), ("qwen2", "auto"), ("qwen2", "model"), ("qwen2", "int8")]
)
def test_tokenswift_equals_plain_through_the_native_decoder(kind: str, kv_cache: str) -> None:
    target = Target(_model(kind))
    assert target.native is not None
    assert_windowed_sampling_is_lossless(target, kv_cache=kv_cache)


def test_auto_stores_float16_where_the_native_decoder_reads_it() -> None:
    native = Target(_model("qwen2"))
    assert kv_storage(RunConfig(max_new_tokens=1), native) == torch.float16
    assert kv_storage(RunConfig(max_new_tokens=1, kv_cache="model"), native) == torch.float32
    native.backend.native = None  # the torch paths would widen a copy of the cache per forward
    assert kv_storage(RunConfig(max_new_tokens=1), native) == torch.float32
    assert kv_storage(RunConfig(max_new_tokens=1, kv_cache="float16"), native) == torch.float16


def test_float16_storage_is_refused_for_a_model_computing_in_bfloat16() -> None:
    model = AutoModelForCausalLM.from_config(tiny_config("qwen2")).to(torch.bfloat16)
    with pytest.raises(ConfigError, match="float16 KV cache is for models computing in float32"):
        kv_storage(RunConfig(max_new_tokens=1, kv_cache="float16"), Target(model))
    with pytest.raises(ConfigError, match="int8 KV cache is for models computing in float32"):
        kv_storage(RunConfig(max_new_tokens=1, kv_cache="int8"), Target(model))


def test_int8_storage_is_refused_for_heads_not_in_groups_of_32() -> None:
    with pytest.raises(ConfigError, match="multiple of 32, not 16"):
        kv_storage(RunConfig(max_new_tokens=1, kv_cache="int8"), Target(_model("llama-mha")))


def test_single_token_forward_over_float16_reads_it_in_place(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The draft pass under a window (one token, not exact) takes the native decoder, not a widened copy."""
    target = Target(_model("qwen2"))
    state = prefill(target, random_prompt(100), RunConfig(max_new_tokens=8, window=ContextWindow(size=64, sinks=4)))
    calls: list[int] = []
    forward = target.native.forward  # type: ignore[union-attr]
    monkeypatch.setattr(target.native, "forward", lambda *a, **k: calls.append(1) or forward(*a, **k))
    target.forward(torch.tensor([3]), state.full)
    assert calls == [1]
    state.full.layer_list[0].dtype = torch.float32  # a cache as the model computes: the fast path
    target.forward(torch.tensor([3]), state.full)
    assert calls == [1]
