"""4-bit weights (`--weights int4`): the decoder's linear layers read an eighth of float32's bytes.

On a CPU, one decoding step reads every weight once, and a float32 matrix-vector product on one core
streams ~12 GB/s while bfloat16's is no faster (measured: benchmarks/record/performance.md). torch's
weight-only int4 kernel for CPUs (`_weight_int4pack_mm_for_cpu`, the one gpt-fast uses) takes
bfloat16 activations and 4-bit weights in groups of 32 along the input, each group with a bfloat16
scale and offset: w = (q - 8) * scale + offset, q in 0..15. It is row-invariant (a row's result does
not depend on the other rows of the batch), so a verified tree still equals plain decoding.

The embedded model is a Q4_1 GGUF: every weight of its linear layers already is m + d * q with a
float16 d and m per group of 32. `Int4Linear.from_linear` finds these exactly in the de-quantised
weights (scale d, offset m + 8d), so the 4-bit model is the GGUF's own, up to the bfloat16 rounding
of d and m + 8d. Other weights are quantised the same way from their group's min and max (lossy).
Everything else (norms, embeddings, attention, the KV cache, the output head) keeps the model's dtype.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

GROUP = 32


def supported(device: torch.device) -> bool:
    return device.type == "cpu" and hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu")


def _groups_of_q4(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, bool]:
    """(q [out, in] int32, scale [out, groups], low [out, groups], exact) with weight ~ low + scale * q.

    exact: every group is low + scale * q with float16 low and scale (a de-quantised Q4_0/Q4_1 tensor).
    """
    out_features, in_features = weight.shape
    groups = weight.float().view(out_features, in_features // GROUP, GROUP)
    low, high = groups.amin(-1), groups.amax(-1)

    def levels(scale: torch.Tensor) -> torch.Tensor:
        safe = torch.where(scale > 0, scale, torch.ones_like(scale))
        return ((groups - low[..., None]) / safe[..., None]).round().clamp(0, 15)

    scale = ((high - low) / 15).half().float()  # a Q4 group's top value is low + 15 d (its q = 15)
    q = levels(scale)
    rebuilt = q * scale[..., None] + low[..., None]
    exact = bool(torch.equal(low.half().float(), low)) and bool(torch.equal(rebuilt, groups))
    if not exact:  # plain asymmetric quantisation from the group's range, in float32
        scale = (high - low) / 15
        q = levels(scale)
    return q.to(torch.int32).view(out_features, in_features), scale, low, exact


def is_q4(model: torch.nn.Module) -> bool:
    """Whether the first decoder block's linear weights are exactly 4-bit groups (a de-quantised Q4 GGUF)."""
    block = model.get_decoder().layers[0]  # type: ignore[operator]
    linears = [m for m in block.modules() if isinstance(m, torch.nn.Linear)]
    return bool(linears) and all(m.in_features % GROUP == 0 and _groups_of_q4(m.weight.detach())[3] for m in linears)


FUSE_BLOCK = 64  # outputs per block of the packed layout (measured: parts of 16, 32, 48, 96 break)


class Int4Linear(torch.nn.Module):
    """A linear layer with 4-bit weights; input, output and bias keep their dtype."""

    def __init__(
        self, packed: torch.Tensor, scales_and_zeros: torch.Tensor, bias: torch.Tensor | None, shape: tuple[int, int]
    ) -> None:
        super().__init__()
        self.out_features, self.in_features = shape
        self.register_buffer("packed", packed)
        self.register_buffer("scales_and_zeros", scales_and_zeros)
        self.bias = bias
        self.splits: tuple[int, ...] = (self.out_features,)

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear) -> tuple[Int4Linear, bool]:
        """The 4-bit layer, and whether it holds the original weights exactly (up to bfloat16 scales)."""
        q, scale, low, exact = _groups_of_q4(linear.weight.detach())
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
        # (q - 8) * scale + zero = low + q * scale
        scales_and_zeros = torch.stack([scale.t(), (low + 8 * scale).t()], dim=-1).contiguous().bfloat16()
        bias = None if linear.bias is None else linear.bias.detach()
        return cls(packed, scales_and_zeros, bias, (linear.out_features, linear.in_features)), exact

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).to(torch.bfloat16)
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(rows, self.packed, GROUP, self.scales_and_zeros).to(x.dtype)
        if self.bias is not None:
            y = y + self.bias
        return y.view(*x.shape[:-1], self.out_features)

    @classmethod
    def fused(cls, parts: list[Int4Linear]) -> Int4Linear:
        """One layer computing `parts` side by side (output `[..., sum of outs]`, split by `splits`).

        The kernel computes each output column on its own, so the fused product gives the parts'
        bits exactly (tested); one call instead of several saves their per-call overhead. The parts
        then read views of the fused buffers, so nothing is stored twice. Only for parts of whole
        blocks of `FUSE_BLOCK` outputs: the packed layout interleaves rows within a block.
        """
        assert all(p.out_features % FUSE_BLOCK == 0 for p in parts)
        packed = torch.cat([p.packed for p in parts], dim=0)
        scales_and_zeros = torch.cat([p.scales_and_zeros for p in parts], dim=1)
        biases = [p.bias if p.bias is not None else torch.zeros(p.out_features) for p in parts]
        bias = torch.cat(biases) if any(p.bias is not None for p in parts) else None
        fused = cls(packed, scales_and_zeros, bias, (packed.shape[0], parts[0].in_features))
        fused.splits = tuple(p.out_features for p in parts)
        start = 0
        for part in parts:
            part.packed = packed[start : start + part.out_features]
            part.scales_and_zeros = scales_and_zeros[:, start : start + part.out_features].contiguous()
            start += part.out_features
        return fused

    def dense_weight(self) -> torch.Tensor:
        """The float32 weights `[out, in]` the kernel computes with (for tests and checks)."""
        eye = torch.eye(self.in_features, dtype=torch.bfloat16)
        return torch.ops.aten._weight_int4pack_mm_for_cpu(eye, self.packed, GROUP, self.scales_and_zeros).float().t()


@dataclass(frozen=True)
class Quantized:
    """What `quantize_decoder` did: layers now in 4 bits, of which exact (Q4 weights kept), and layers kept dense."""

    layers: int
    exact: int
    kept: int


def quantize_decoder(model: torch.nn.Module, discard: Callable[[torch.Tensor], object] | None = None) -> Quantized:
    """Replace every linear layer of the decoder's blocks by an `Int4Linear` (in place).

    The output head and the embeddings stay as they are: the head is the embedding matrix in tied
    models, and it decides every token, so it keeps full precision. `discard` gets each dense
    weight once it is replaced (to give its memory back at once).
    """
    decoder = model.get_decoder()  # type: ignore[operator]
    layers = exact = kept = 0
    for block in decoder.layers:
        for name, module in list(block.named_modules()):
            if not isinstance(module, torch.nn.Linear):
                continue
            if module.in_features % GROUP:
                kept += 1
                continue
            replacement, was_exact = Int4Linear.from_linear(module)
            parent = block.get_submodule(name.rpartition(".")[0]) if "." in name else block
            setattr(parent, name.rpartition(".")[2], replacement)
            if discard is not None:
                discard(module.weight)
            layers, exact = layers + 1, exact + was_exact
        _fuse_projections(block)
    return Quantized(layers, exact, kept)


def _fuse_projections(block: torch.nn.Module) -> None:
    """`self_attn.qkv_int4` and `mlp.gate_up_int4`: the projections that read the same input, fused."""
    attn, mlp = block.self_attn, block.mlp

    def fusable(parts: list[object]) -> bool:
        return all(isinstance(m, Int4Linear) and m.out_features % FUSE_BLOCK == 0 for m in parts)

    qkv = [attn.q_proj, attn.k_proj, attn.v_proj]
    if fusable(qkv):
        attn.qkv_int4 = Int4Linear.fused(qkv)
    gate_up = [getattr(mlp, "gate_proj", None), getattr(mlp, "up_proj", None)]
    if fusable(gate_up):
        mlp.gate_up_int4 = Int4Linear.fused(gate_up)  # type: ignore[arg-type]
