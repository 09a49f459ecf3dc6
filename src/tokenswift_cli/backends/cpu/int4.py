"""4-bit weights (`--weights int4`): the decoder's linear layers read an eighth of float32's bytes.

On a CPU, one decoding step reads every weight once, so bytes are time; and the products are done
as llama.cpp does them, in integers: each row of activations is quantised per group of 32 to 8 bits
(x ~ dx * xq), the weights are 4-bit levels with a float16 scale and offset per group of 32
(w = m + d * q, q in 0..15), and `csrc/quantised_products.cpp` sums q * xq with integer dot products
(AVX-512 VNNI `vpdpbusd`, or AVX2's multiply-adds), then scales each group's sum in float32 in one
fixed order. A row's result depends on that row alone, so a verified tree still equals plain decoding.

The embedded model is a Q4_1 GGUF: every weight of its linear layers already is m + d * q with a
float16 d and m per group of 32. `Int4Linear.from_linear` finds these exactly in the de-quantised
weights, so the 4-bit layers hold the GGUF's own numbers. Other weights are quantised the same way
from their group's min and max (lossy). Everything else (norms, embeddings, attention, the KV cache,
the output head) keeps the model's dtype.

`ARITHMETIC` names this arithmetic: runs record it, and a run written under another says so when it
resumes (its text from there may part from what it would have written).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from tokenswift_cli.backends.cpu import kernels

GROUP = 32
LANES = 16  # scales and offsets are stored padded to a multiple of this many groups
OUTPUTS = 4  # weight rows stored interleaved, read together
ARITHMETIC = "8-bit activations, integer products"  # the 4-bit layers and the Q8_0 head (q8_head.py)
# What runs written until 2026-11-27 (which record none) used: torch's `_weight_int4pack_mm_for_cpu`.
EARLIER = "bfloat16 activations (float32 at the head)"


def supported(device: torch.device) -> bool:
    return device.type == "cpu" and kernels.available()


def _groups_of_q4(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, bool]:
    """(q [out, in] int32, scale [out, groups], low [out, groups], exact) with weight ~ low + scale * q.

    scale and low are float16 values. exact: every group is low + scale * q (a de-quantised Q4_1
    tensor); otherwise the groups are quantised from their range, each weight within half a step.
    """
    out_features, in_features = weight.shape
    groups = weight.float().view(out_features, in_features // GROUP, GROUP)
    low, high = groups.amin(-1), groups.amax(-1)
    scale = ((high - low) / 15).half().float()  # a Q4 group's top value is low + 15 d (its q = 15)
    low16 = low.half().float()
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = ((groups - low16[..., None]) / safe[..., None]).round().clamp(0, 15)
    exact = bool(torch.equal(low16, low)) and bool(torch.equal(q * scale[..., None] + low16[..., None], groups))
    return q.to(torch.int32).view(out_features, in_features), scale, low16, exact


def is_q4(model: torch.nn.Module) -> bool:
    """Whether the first decoder block's linear weights are exactly 4-bit groups (a de-quantised Q4 GGUF)."""
    block = model.get_decoder().layers[0]  # type: ignore[operator]
    linears = [m for m in block.modules() if isinstance(m, torch.nn.Linear)]
    return bool(linears) and all(m.in_features % GROUP == 0 and _groups_of_q4(m.weight.detach())[3] for m in linears)


def grouped(values: torch.Tensor) -> torch.Tensor:
    """[out, in] -> [out rounded up to OUTPUTS, an even number of groups, GROUP], zeros after: the padding
    quantised_products.cpp reads (rows in blocks of OUTPUTS, groups by pairs)."""
    out_features, in_features = values.shape
    groups, rows = in_features // GROUP, -(-out_features // OUTPUTS) * OUTPUTS
    out = values.new_zeros(rows, groups + groups % 2, GROUP)
    out[:out_features, :groups] = values.view(out_features, groups, GROUP)
    return out


def interleave(pairs: torch.Tensor) -> torch.Tensor:
    """Per row and pair of groups, its bytes [rows, pairs, pair bytes] (rows a multiple of OUTPUTS) -> the
    stored layout [rows / OUTPUTS, pairs * OUTPUTS * pair bytes]: per block of rows, per pair, each row's
    bytes side by side, so that a block's rows are read together, from one stream."""
    rows, _, width = pairs.shape
    blocks = pairs.view(rows // OUTPUTS, OUTPUTS, -1, width).transpose(1, 2)  # [blocks, pairs, OUTPUTS, width]
    return blocks.reshape(rows // OUTPUTS, -1).contiguous().view(torch.uint8)


def deinterleave(packed: torch.Tensor, width: int) -> torch.Tensor:
    """`interleave`'s inverse: [rows (padded), pairs, width] bytes."""
    blocks = packed.view(packed.shape[0], -1, OUTPUTS, width).transpose(1, 2)  # [blocks, OUTPUTS, pairs, width]
    return blocks.reshape(packed.shape[0] * OUTPUTS, -1, width)


def pack(q: torch.Tensor) -> torch.Tensor:
    """Levels [out, in] (0..15) -> the stored bytes (`interleave`): per pair p of groups a row's 32 bytes,
    byte j being group 2p's q_j | group 2p+1's q_j << 4."""
    pairs = grouped(q.to(torch.uint8)).view(-1, (q.shape[1] // GROUP + 1) // 2, 2, GROUP)
    return interleave(pairs[:, :, 0] | (pairs[:, :, 1] << 4))


def unpack(packed: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    """`pack`'s inverse: levels [out, in] as int32."""
    out_features, in_features = shape
    nibbles = deinterleave(packed, GROUP)
    both = torch.stack([nibbles & 0x0F, nibbles >> 4], dim=2).reshape(nibbles.shape[0], -1)
    return both[:out_features, :in_features].to(torch.int32)


def padded_scales(values: torch.Tensor) -> torch.Tensor:
    """[out, groups] -> float16 [out rounded up to OUTPUTS, groups rounded up to LANES], zeros after."""
    out_features, groups = values.shape
    rows, columns = -(-out_features // OUTPUTS) * OUTPUTS, -(-groups // LANES) * LANES
    stored = torch.zeros(rows, columns, dtype=torch.float16)
    stored[:out_features, :groups] = values.half()
    return stored


class Int4Linear(torch.nn.Module):
    """A linear layer with 4-bit weights; input, output and bias keep their dtype."""

    def __init__(
        self, packed: torch.Tensor, scales: torch.Tensor, lows: torch.Tensor, bias: torch.Tensor | None,
        shape: tuple[int, int],
    ) -> None:  # fmt: skip
        super().__init__()
        self.out_features, self.in_features = shape
        self.register_buffer("packed", packed)
        self.register_buffer("scales", scales)
        self.register_buffer("lows", lows)
        self.bias = bias
        self.splits: tuple[int, ...] = (self.out_features,)

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear) -> tuple[Int4Linear, bool]:
        """The 4-bit layer, and whether it holds the original weights exactly."""
        q, scale, low, exact = _groups_of_q4(linear.weight.detach())
        bias = None if linear.bias is None else linear.bias.detach().float().contiguous()
        layer = cls(pack(q), padded_scales(scale), padded_scales(low), bias, (linear.out_features, linear.in_features))
        return layer, exact

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).float()
        y = kernels.load().q4_products(rows, self.packed, self.scales, self.lows, self.bias, self.out_features)
        y = y.to(x.dtype)
        return y.view(*x.shape[:-1], self.out_features)

    @classmethod
    def fused(cls, parts: list[Int4Linear]) -> Int4Linear:
        """One layer computing `parts` side by side (output `[..., sum of outs]`, split by `splits`).

        Each output is computed on its own, so the fused product gives the parts' bits exactly
        (tested); one call instead of several saves their per-call overhead. The parts then read
        views of the fused buffers, so nothing is stored twice.
        """
        assert all(p.out_features % OUTPUTS == 0 for p in parts)  # no padding rows between parts
        packed = torch.cat([p.packed for p in parts])
        scales, lows = torch.cat([p.scales for p in parts]), torch.cat([p.lows for p in parts])
        biases = [p.bias if p.bias is not None else torch.zeros(p.out_features) for p in parts]
        bias = torch.cat(biases) if any(p.bias is not None for p in parts) else None
        fused = cls(packed, scales, lows, bias, (scales.shape[0], parts[0].in_features))
        fused.splits = tuple(p.out_features for p in parts)
        start = 0
        for part in parts:
            rows = slice(start, start + part.out_features)
            part.packed = packed[start // OUTPUTS : (start + part.out_features) // OUTPUTS]
            part.scales, part.lows = scales[rows], lows[rows]
            start += part.out_features
        return fused

    def dense_weight(self) -> torch.Tensor:
        """The float32 weights `[out, in]` the layer stores: m + d * q per group."""
        groups = self.in_features // GROUP
        q = unpack(self.packed, (self.out_features, self.in_features)).float().view(self.out_features, groups, GROUP)
        d, m = self.scales[: self.out_features, :groups].float(), self.lows[: self.out_features, :groups].float()
        return (m[..., None] + d[..., None] * q).view(self.out_features, self.in_features)


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
        return all(isinstance(m, Int4Linear) and m.out_features % OUTPUTS == 0 for m in parts)

    qkv = [attn.q_proj, attn.k_proj, attn.v_proj]
    if fusable(qkv):
        attn.qkv_int4 = Int4Linear.fused(qkv)
    gate_up = [getattr(mlp, "gate_proj", None), getattr(mlp, "up_proj", None)]
    if fusable(gate_up):
        mlp.gate_up_int4 = Int4Linear.fused(gate_up)  # type: ignore[arg-type]
