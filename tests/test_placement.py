"""`--device auto` beyond a device's memory: accelerate offloads some modules (their weights on `meta`,
brought in for each call) and every backend computes them on the execution device, writing the text
of the model held whole. On a CPU the offload goes to disk; on a GPU it is the CPU (tests/test_gpu.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import tiny_model
from helpers import first_divergence, random_prompt
from padded_checks import GREEDY, SEEDED, tokenswift_equals_plain

from tokenswift_cli.backends.cuda.graphs import GRAPHS
from tokenswift_cli.backends.cuda.padded import FORCE, PaddedBackend
from tokenswift_cli.backends.lean import LeanBackend
from tokenswift_cli.backends.placement import execution_device
from tokenswift_cli.backends.stock import StockBackend
from tokenswift_cli.config import RunConfig, SamplingConfig
from tokenswift_cli.engine.decode import generate_tokens
from tokenswift_cli.model.target import Target

BACKENDS = {"lean": LeanBackend, "stock": StockBackend, "padded": PaddedBackend}


def offloaded(family: str, folder: Path) -> torch.nn.Module:
    """The tiny model with its second layer, final norm and output head offloaded to disk."""
    from accelerate import dispatch_model

    device_map = {"model.embed_tokens": "cpu", "model.rotary_emb": "cpu", "model.layers.0": "cpu",
                  "model.layers.1": "disk", "model.norm": "disk", "lm_head": "disk"}  # fmt: skip
    return dispatch_model(tiny_model(family), device_map, offload_dir=str(folder))


def target_for(model: torch.nn.Module, backend: str, monkeypatch: pytest.MonkeyPatch) -> Target:
    if backend == "padded":
        monkeypatch.setenv(FORCE, "1")
        monkeypatch.setenv(GRAPHS, "body")
    target = Target(model, lean=backend != "stock")
    assert type(target.backend) is BACKENDS[backend]
    return target


def plain_text(target: Target, sampling: SamplingConfig) -> list[int]:
    cfg = RunConfig(max_new_tokens=40, sampling=sampling, prefill_chunk=32, mode="plain")
    return generate_tokens(target, None, random_prompt(60), cfg)[0]


def test_a_hooked_module_computes_on_its_hooks_device(tmp_path: Path) -> None:
    model = offloaded("llama-gqa", tmp_path)
    layer = model.model.layers[1]
    assert layer.input_layernorm.weight.device.type == "meta"
    assert execution_device(layer) == torch.device("cpu") == execution_device(model.lm_head)
    assert execution_device(tiny_model("llama-gqa").model.norm) == torch.device("cpu")  # no hook: its weight's


@pytest.mark.parametrize("backend", list(BACKENDS))
@pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_offloaded_layers_write_the_text_of_the_whole_model(
    family: str, backend: str, sampling: SamplingConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = target_for(offloaded(family, tmp_path), backend, monkeypatch)
    if backend == "padded":  # accelerate's hooks copy the weights in at each call: nothing to capture
        assert target.backend.graphs is None and target.backend.draft_graphs is None
    assert target.layer_devices == [torch.device("cpu")] * 2 and target.output_device == torch.device("cpu")
    whole = target_for(tiny_model(family), backend, monkeypatch)
    assert first_divergence(plain_text(target, sampling), plain_text(whole, sampling)) is None
    if backend != "stock":
        divergence, iterations, tokens = tokenswift_equals_plain(target, sampling, tokens=80)
        assert divergence is None and iterations < tokens
