"""The process settings under which a cuBLAS product's rows do not depend on how it is split.

vLLM's batch-invariant mode on SM90/SM100 (vllm/model_executor/layers/batch_invariant.py) keeps
cuBLAS but takes away split-K (a workspace too small for it, cuBLASLt preferred) and the reduced-
precision reductions of bfloat16/float16 products; float32 products in IEEE precision (no TF32).
With every product of a forward at one padded shape (`padded.py`) the same kernel runs each step.
"""

from __future__ import annotations

import os

import torch

# Read when a device's cuBLAS handle is made (its first product): set before that, or they do nothing.
WORKSPACE = {"CUBLAS_WORKSPACE_CONFIG": ":16:8", "CUBLASLT_WORKSPACE_SIZE": "1"}


def configure(device: torch.device) -> None:
    """Apply the settings for a CUDA `device` (process-wide; nothing on other devices)."""
    if device.type != "cuda":
        return
    for name, value in WORKSPACE.items():
        os.environ.setdefault(name, value)
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    torch.set_float32_matmul_precision("highest")
    torch.backends.cuda.preferred_blas_library("cublaslt")


def settings() -> dict[str, str]:
    """What is in force, for a bench's or a test's record."""
    matmul = torch.backends.cuda.matmul
    return {
        **{name: os.environ.get(name, "") for name in WORKSPACE},
        "bf16_reduced_precision": str(matmul.allow_bf16_reduced_precision_reduction),
        "fp16_reduced_precision": str(matmul.allow_fp16_reduced_precision_reduction),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
    }
