"""The one place that decides how a model's forwards run: from its device, dtype and weights, once."""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from tokenswift_cli.backends.base import Backend
from tokenswift_cli.backends.cpu.blocks import compute_dtype
from tokenswift_cli.backends.cpu.invariant import BatchInvariantBackend, q8_head_for, rounds_inputs
from tokenswift_cli.backends.cuda import padded
from tokenswift_cli.backends.lean import LeanBackend, supports_lean
from tokenswift_cli.backends.placement import execution_device
from tokenswift_cli.backends.stock import ATTENTION_NAME, StockBackend


def backend_for(model: PreTrainedModel, *, lean: bool | None = None) -> Backend:
    """The backend for `model`: `lean` None takes the lean forward where the model supports it, False the stock one.

    On a CPU, a model computing in reduced precision or with 4-bit layers gets the batch-invariant
    backend (verification gives plain decoding's bits there: a measured CPU property); everything
    else runs the fast kernels.
    """
    # On every backend (the stock one needs it): code calling the model itself (quality measures, tests)
    # then attends as the stock backend does.
    model.set_attn_implementation(ATTENTION_NAME)
    lean = supports_lean(model) if lean is None else lean
    dtype = compute_dtype(model.get_decoder().embed_tokens)
    on_cpu = execution_device(model.get_decoder().embed_tokens).type == "cpu"
    if not lean:
        return StockBackend(model, q8_head=q8_head_for(model) if on_cpu else None)
    if padded.applies(model):  # CUDA: exact forwards at one padded row count (or forced, for tests)
        return padded.PaddedBackend(model)
    if on_cpu and (dtype != torch.float32 or rounds_inputs(model)):
        return BatchInvariantBackend(model)
    return LeanBackend(model)
