"""The backend is chosen once, from the model's device, dtype and weights."""

from __future__ import annotations

import torch
from conftest import tiny_model

from tokenswift_cli.backends.cpu.int4 import quantize_decoder
from tokenswift_cli.backends.cpu.invariant import BatchInvariantBackend
from tokenswift_cli.backends.lean import LeanBackend
from tokenswift_cli.backends.stock import StockBackend
from tokenswift_cli.model.target import Target


def test_a_float32_model_takes_the_lean_backend_and_lean_false_the_stock_one() -> None:
    model = tiny_model("llama-gqa")
    lean = Target(model)
    assert type(lean.backend) is LeanBackend and lean.lean and lean.native is None
    stock = Target(model, lean=False)
    assert type(stock.backend) is StockBackend and not stock.lean


def test_reduced_precision_or_4bit_weights_on_a_cpu_take_the_batch_invariant_backend() -> None:
    assert type(Target(tiny_model("qwen2").to(torch.bfloat16)).backend) is BatchInvariantBackend
    model = tiny_model("qwen2")
    quantize_decoder(model)
    target = Target(model)
    assert type(target.backend) is BatchInvariantBackend and target.rounds_inputs
    assert type(Target(model, lean=False).backend) is StockBackend  # the stock decoder stays one
