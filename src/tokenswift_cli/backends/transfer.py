"""Host-to-device copies that do not wait for the GPU.

A copy from ordinary (pageable) host memory to a GPU blocks the host until the GPU has finished
the work queued before it: one synchronisation per upload, invisible in the code. Copied from pinned
memory with `non_blocking`, it queues like a kernel; torch's pinned-memory cache keeps the source
alive until the copy is done. Elsewhere (a CPU) these are plain tensors.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def upload(values: Sequence[int] | Sequence[float], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A host list as a tensor on `device`."""
    if device.type != "cuda":
        return torch.tensor(values, dtype=dtype, device=device)
    return torch.tensor(values, dtype=dtype, pin_memory=True).to(device, non_blocking=True)


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`tensor` on `device`; a host tensor goes to a GPU through pinned memory."""
    if device.type != "cuda" or tensor.device.type != "cpu":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)
