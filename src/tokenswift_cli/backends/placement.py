"""Where a module computes when accelerate dispatched the model (`--device auto`).

A model larger than the GPU keeps some layers' weights in CPU memory (or on disk): accelerate puts
those weights on the `meta` device and hooks every module that holds some, so that each call brings
them to the execution device for that call. The lean loops call a layer's modules one by one (which
fires those hooks), so they take a layer's device from its hook, never from a weight that may sit
on `meta`.
"""

from __future__ import annotations

import itertools

import torch


def execution_device(module: torch.nn.Module) -> torch.device:
    """The device `module` computes on: its accelerate hook's, else its first weight's (or buffer's)."""
    hook = getattr(module, "_hf_hook", None)
    for each in getattr(hook, "hooks", [hook]):  # a SequentialHook holds several
        device = getattr(each, "execution_device", None)
        if device is not None:
            return torch.device(f"cuda:{device}" if isinstance(device, int) else device)
    for tensor in itertools.chain(module.parameters(), module.buffers()):
        return tensor.device
    raise ValueError(f"{type(module).__name__} holds no weights and no accelerate hook: no device to compute on")
