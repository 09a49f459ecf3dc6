"""The output head as a Q8_0 tensor (int8 values, a scale per group of 32), by a C++ kernel (CPU).

The embedded model's GGUF stores its tied embedding and output head as Q8_0; its float32 copy holds
exactly those values, so they are recovered losslessly (`Q8Head.from_weight`) and the head reads
int8: a quarter of float32's bytes (113 MB per step for SmolLM2's 49,152 x 576 head). Each logit
depends only on its own row (csrc/q8_logits.cpp), so verification stays batch-invariant. Used with
4-bit weights (where the model is this engine's own, not `transformers`' float32 one).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tokenswift_cli.backends.cpu import kernels

GROUP = 32


@dataclass(frozen=True)
class Q8Head:
    values: torch.Tensor  # [vocab, hidden] int8
    scales: torch.Tensor  # [vocab, hidden / 32] float32

    @classmethod
    def from_weight(cls, weight: torch.Tensor, rows: int = 16384) -> Q8Head | None:
        """The Q8_0 form of `weight` `[vocab, hidden]`, or None when it is not exactly one.

        Converted `rows` at a time, so that the check's temporaries stay small (the embedded
        model's head is 108 MiB in float32).
        """
        if weight.dtype != torch.float32 or weight.shape[1] % GROUP or weight.device.type != "cpu":
            return None
        parts = [_q8_rows(weight.detach()[start : start + rows]) for start in range(0, weight.shape[0], rows)]
        if any(part is None for part in parts):
            return None
        values, scales = zip(*parts, strict=True)  # type: ignore[misc]
        return cls(torch.cat(values).contiguous(), torch.cat(scales).contiguous())

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Float32 logits `[..., vocab]` of hidden states `[..., hidden]`."""
        flat = hidden.float().reshape(-1, hidden.shape[-1]).contiguous()
        out = kernels.load().q8_logits(flat, self.values, self.scales)
        return out.reshape(*hidden.shape[:-1], -1)


def _q8_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(int8 values, float32 scales) of rows that are exactly Q8_0 groups, else None."""
    groups = weight.reshape(weight.shape[0], -1, GROUP)  # [rows, groups, 32]
    scales = (groups.abs().amax(-1) / 127).half().float()  # Q8_0: d = amax / 127, stored as float16
    safe = torch.where(scales == 0, torch.ones_like(scales), scales)
    values = groups / safe[..., None]
    rounded = values.round()
    if not torch.equal(values, rounded) or rounded.abs().max() > 127:
        return None
    if not torch.equal(rounded * scales[..., None], groups):
        return None
    return rounded.to(torch.int8).reshape(weight.shape), scales
