"""The output head as a Q8_0 tensor (int8 values, a scale per group of 32), by a C++ kernel (CPU).

The embedded model's GGUF stores its tied embedding and output head as Q8_0; its float32 copy holds
exactly those values, so they are recovered losslessly (`Q8Head.from_weight`) and the head reads
int8: a quarter of float32's bytes (113 MB per step for SmolLM2's 49,152 x 576 head). The hidden state
is quantised to 8 bits per group of 32 and multiplied in integers, as the 4-bit layers are
(csrc/quantised_products.cpp). Each logit depends only on its own row, so verification stays
batch-invariant. Used with 4-bit weights (where the model is this engine's own, not `transformers`'
float32 one).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tokenswift_cli.backends.cpu import kernels
from tokenswift_cli.backends.cpu.int4 import GROUP, deinterleave, grouped, interleave, padded_scales


@dataclass(frozen=True)
class Q8Head:
    packed: torch.Tensor  # [vocab / 4, hidden * 4] bytes: per block of 4 rows, per pair of groups, each row's 64
    scales: torch.Tensor  # [vocab rounded up to 4, groups rounded up to 16] float16, zeros past the real ones
    vocab: int
    hidden: int

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
        return cls.from_values(torch.cat(values), torch.cat(scales))

    @classmethod
    def from_values(cls, values: torch.Tensor, scales: torch.Tensor) -> Q8Head:
        """From int8 values `[vocab, hidden]` and their float16-exact scales `[vocab, hidden / 32]`."""
        vocab, hidden = values.shape
        pairs = grouped(values).view(-1, (hidden // GROUP + 1) // 2, 2 * GROUP)  # a row's pair: 64 values
        return cls(interleave(pairs), padded_scales(scales), vocab, hidden)

    def values(self) -> torch.Tensor:
        """The int8 values `[vocab, hidden]` (for tests and checks)."""
        rows = deinterleave(self.packed, 2 * GROUP).view(torch.int8)
        return rows.reshape(rows.shape[0], -1)[: self.vocab, : self.hidden]

    def group_scales(self) -> torch.Tensor:
        """The float32 scales `[vocab, hidden / 32]`."""
        return self.scales[: self.vocab, : self.hidden // GROUP].float()

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Float32 logits `[..., vocab]` of hidden states `[..., hidden]`."""
        flat = hidden.float().reshape(-1, hidden.shape[-1])
        out = kernels.load().q8_products(flat, self.packed, self.scales, self.vocab)
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
