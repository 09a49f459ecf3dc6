"""Tiny randomly initialised models of each supported family, built in the tests (CPU, float32)."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():  # the Triton kernels run in Triton's interpreter: set before anything imports it
    os.environ.setdefault("TRITON_INTERPRET", "1")
from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig, Qwen2Config

VOCAB = 96
LOGIT_SCALE = 0.35


def tiny_config(family: str):  # type: ignore[no-untyped-def]
    common = {
        "vocab_size": VOCAB,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": False,
        "bos_token_id": 0,
        "eos_token_id": None,
        "pad_token_id": None,
    }
    if family == "llama-mha":
        return LlamaConfig(num_attention_heads=4, num_key_value_heads=4, **common)
    if family == "llama-gqa":
        return LlamaConfig(num_attention_heads=8, num_key_value_heads=2, **common)
    if family == "qwen2":
        return Qwen2Config(num_attention_heads=4, num_key_value_heads=2, **common)
    if family == "mistral":
        return MistralConfig(num_attention_heads=4, num_key_value_heads=2, sliding_window=None, **common)
    raise ValueError(family)


def tiny_model(family: str, seed: int = 0):  # type: ignore[no-untyped-def]
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(family), attn_implementation="sdpa")
    # A random model's distribution is nearly flat; sharpen it so that greedy has no near-ties and
    # sampling is neither uniform nor stuck on one token.
    with torch.no_grad():
        model.get_output_embeddings().weight.normal_(0.0, LOGIT_SCALE)
    return model.eval()


FAMILIES = ["llama-mha", "llama-gqa", "qwen2", "mistral"]


@pytest.fixture(params=FAMILIES[:3])
def family(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_threads() -> int:
    """Torch threads per test process: TOKENSWIFT_TEST_THREADS if set (1 keeps the tests off a core another
    job is using), else the cores shared out among pytest-xdist's workers (`make test` runs two), at least 1."""
    if "TOKENSWIFT_TEST_THREADS" in os.environ:
        return int(os.environ["TOKENSWIFT_TEST_THREADS"])
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    return max(1, min(2, (os.cpu_count() or 1) // workers))


test_threads.__test__ = False  # type: ignore[attr-defined]  # a helper, not a test


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.setenv("TOKENSWIFT_HOME", str(tmp_path / "home"))  # tmp_path: per test, per xdist worker
    torch.set_num_threads(test_threads())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked `gpu` skip where no CUDA device is (CI); `pytest -m gpu` runs only them."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
