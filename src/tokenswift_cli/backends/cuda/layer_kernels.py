"""Fused elementwise pieces of a decoder layer for the padded backend: fewer kernels per layer, same rule per row.

A graph replay of the torch ops launches ~7 kernels per RMSNorm (casts, square, mean, rsqrt, products),
~10 for the rotary embedding and 3 for the MLP's activation; here each is one Triton kernel, the
residual adds ride with the norm after them, and q/k/v (gate/up) are one product over joined weights.
Each row is one program reducing in a fixed order, so a row's bits do not depend on the rows beside
it (the padded backend's rule). The bits differ from the torch ops', so every exact forward takes
these or none: the padded backend decides once, at load.
On CPU tensors they run in Triton's interpreter (`TRITON_INTERPRET=1`), as the tests do.
"""

from __future__ import annotations

import functools
import weakref
from typing import Any

import torch

from tokenswift_cli.backends.cuda import attention_kernel
from tokenswift_cli.backends.cuda.attention_kernel import rounded

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = tl = None

NORMS = {"LlamaRMSNorm", "Qwen2RMSNorm", "MistralRMSNorm"}  # weight * (x / rms(x)), in the input's dtype
SILU_BLOCK = 1024  # columns of a row per program of the activation


def _norm_kernel(  # type: ignore[no-untyped-def]
    x_ptr, delta_ptr, weight_ptr, out_ptr, sum_ptr, width, eps,
    HAS_DELTA: tl.constexpr, BLOCK: tl.constexpr, TO_BF16: tl.constexpr,
):  # fmt: skip
    """One row: (x + delta) stored as the new residual stream, then its RMSNorm times the weight."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    ok = cols < width
    x = tl.load(x_ptr + row * width + cols, mask=ok, other=0.0).to(tl.float32)
    if HAS_DELTA:
        x = x + tl.load(delta_ptr + row * width + cols, mask=ok, other=0.0).to(tl.float32)
        summed = rounded(x, TO_BF16, sum_ptr.dtype.element_ty)
        tl.store(sum_ptr + row * width + cols, summed, mask=ok)
        x = summed.to(tl.float32)
    scale = 1.0 / tl.sqrt(tl.sum(x * x, 0) / width + eps)
    weight = tl.load(weight_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * width + cols, rounded(x * scale * weight, TO_BF16, out_ptr.dtype.element_ty), mask=ok)


def _rope_kernel(  # type: ignore[no-untyped-def]
    x_ptr, cos_ptr, sin_ptr, out_ptr, heads, s_xr, s_xh, s_cr, s_or, s_oh,
    HALF: tl.constexpr, TO_BF16: tl.constexpr,
):  # fmt: skip
    """One (row, head): x * cos + rotate_half(x) * sin, from `[rows, heads, d]` strides to the output's."""
    row, head = tl.program_id(0), tl.program_id(1)
    first = tl.arange(0, HALF)
    at = x_ptr + row * s_xr + head * s_xh
    low, high = tl.load(at + first).to(tl.float32), tl.load(at + HALF + first).to(tl.float32)
    cos_low = tl.load(cos_ptr + row * s_cr + first).to(tl.float32)
    cos_high = tl.load(cos_ptr + row * s_cr + HALF + first).to(tl.float32)
    sin_low = tl.load(sin_ptr + row * s_cr + first).to(tl.float32)
    sin_high = tl.load(sin_ptr + row * s_cr + HALF + first).to(tl.float32)
    dtype = out_ptr.dtype.element_ty
    out = out_ptr + row * s_or + head * s_oh
    tl.store(out + first, rounded(low * cos_low - high * sin_low, TO_BF16, dtype))
    tl.store(out + HALF + first, rounded(high * cos_high + low * sin_high, TO_BF16, dtype))


def _silu_mul_kernel(gate_up_ptr, out_ptr, width, BLOCK: tl.constexpr, TO_BF16: tl.constexpr):  # type: ignore[no-untyped-def]
    """One block of a row: silu(gate) * up, from the joined product's row [gate | up]."""
    row, block = tl.program_id(0), tl.program_id(1)
    cols = block * BLOCK + tl.arange(0, BLOCK)
    ok = cols < width
    gate = tl.load(gate_up_ptr + row * 2 * width + cols, mask=ok, other=0.0).to(tl.float32)
    up = tl.load(gate_up_ptr + row * 2 * width + width + cols, mask=ok, other=0.0).to(tl.float32)
    value = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(out_ptr + row * width + cols, rounded(value, TO_BF16, out_ptr.dtype.element_ty), mask=ok)


@functools.cache
def _kernels() -> dict[str, Any]:
    return {"norm": triton.jit(_norm_kernel), "rope": triton.jit(_rope_kernel), "silu": triton.jit(_silu_mul_kernel)}


def applies(layer: torch.nn.Module) -> bool:
    """Whether the layer's norms are the RMSNorm these kernels compute and its MLP is gate/up/down with SiLU."""
    mlp, head_dim = layer.mlp, layer.self_attn.head_dim
    act = getattr(getattr(mlp, "config", None), "hidden_act", None)
    return (
        head_dim >= 32
        and head_dim & (head_dim - 1) == 0  # halves of a power of two (Triton's ranges)
        and type(layer.input_layernorm).__name__ in NORMS
        and type(layer.post_attention_layernorm).__name__ in NORMS
        and all(hasattr(mlp, name) for name in ("gate_proj", "up_proj", "down_proj"))
        and act in ("silu", "swish")
    )


def rms_norm(
    norm: torch.nn.Module, x: torch.Tensor, delta: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(RMSNorm of `x + delta`, `x + delta`) for `x` `[1, rows, width]`; without `delta`, of `x` itself."""
    width = x.shape[-1]
    x = x.contiguous()
    out = torch.empty_like(x)
    total = torch.empty_like(x) if delta is not None else x
    _kernels()["norm"][(x.numel() // width,)](
        x, delta.contiguous() if delta is not None else x, norm.weight, out, total, width,
        float(getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6))),
        HAS_DELTA=delta is not None, BLOCK=triton.next_power_of_2(width), TO_BF16=x.dtype == torch.bfloat16,
    )  # fmt: skip
    return out, total


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """`[1, heads, rows, d]` rotated queries or keys of `x` `[1, rows, heads, d]`; cos/sin `[1, rows, d]`."""
    _, rows, heads, dim = x.shape
    out = torch.empty(1, heads, rows, dim, dtype=x.dtype, device=x.device)
    cos, sin = cos.contiguous(), sin.contiguous()
    _kernels()["rope"][(rows, heads)](
        x, cos, sin, out, heads, x.stride(1), x.stride(2), cos.stride(1), out.stride(2), out.stride(1),
        HALF=dim // 2, TO_BF16=x.dtype == torch.bfloat16,
    )  # fmt: skip
    return out


def mlp(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """down(silu(gate(x)) * up(x)): gate and up in one product, the activation and product in one kernel."""
    gate_up = joined_product(module, ("gate_proj", "up_proj"), x)  # [1, rows, 2 * width]
    width = gate_up.shape[-1] // 2
    product = gate_up.new_empty(*gate_up.shape[:-1], width)
    _kernels()["silu"][(product.numel() // width, triton.cdiv(width, SILU_BLOCK))](
        gate_up, product, width, BLOCK=SILU_BLOCK, TO_BF16=gate_up.dtype == torch.bfloat16
    )
    return module.down_proj(product)


def projections(attn: torch.nn.Module, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Query, key, value `[1, rows, heads, d]` (views) of `hidden` `[1, rows, hidden]`, from one product."""
    joined = joined_product(attn, ("q_proj", "k_proj", "v_proj"), hidden)
    sizes = [getattr(attn, name).weight.shape[0] for name in ("q_proj", "k_proj", "v_proj")]
    by_head = (1, hidden.shape[1], -1, attn.head_dim)
    query, key, value = (part.reshape(by_head) for part in joined.split(sizes, dim=-1))
    return query, key, value


_JOINED: weakref.WeakKeyDictionary[torch.nn.Module, tuple[torch.Tensor, torch.Tensor | None]] = (
    weakref.WeakKeyDictionary()
)


def joined_product(module: torch.nn.Module, names: tuple[str, ...], x: torch.Tensor) -> torch.Tensor:
    """`x` through `module`'s linear layers `names` as one product, their outputs side by side.

    The first call joins their weights into one tensor and points each layer's weight at its rows
    (no second copy); a weight moved since (`.to`) is joined again.
    """
    linears = [getattr(module, name) for name in names]
    held = _JOINED.get(module)
    if held is None or linears[0].weight.data_ptr() != held[0].data_ptr():
        weight = torch.cat([linear.weight.detach() for linear in linears])
        biases = [linear.bias for linear in linears]
        bias = None if all(b is None for b in biases) else torch.cat([
            b.detach() if b is not None else torch.zeros(lin.weight.shape[0], dtype=weight.dtype, device=weight.device)
            for b, lin in zip(biases, linears, strict=True)
        ])  # fmt: skip
        start = 0
        for linear in linears:
            rows = linear.weight.shape[0]
            linear.weight.data = weight[start : start + rows]
            if linear.bias is not None and bias is not None:
                linear.bias.data = bias[start : start + rows]
            start += rows
        held = _JOINED[module] = (weight, bias)
    return torch.nn.functional.linear(x, *held)


def available() -> bool:
    """Where the attention kernels can run, these can."""
    return attention_kernel.available()


@functools.cache
def usable(device: torch.device, dtype: torch.dtype) -> str | None:
    """None if the kernels build and compute what the torch ops do (within rounding) on `device`, else why not.

    Checked once per process before the padded backend fuses its layers with them.
    """
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm

    generator = torch.Generator().manual_seed(0)
    norm, block = LlamaRMSNorm(64).to(device, dtype), LlamaMLP(LlamaConfig(hidden_size=64, intermediate_size=96))
    block = block.to(device, dtype)
    x, delta = (torch.randn(1, 5, 64, generator=generator).to(device, dtype) for _ in range(2))
    heads, angles = torch.randn(1, 5, 2, 32, generator=generator), torch.rand(1, 5, 32, generator=generator)
    heads, cos, sin = heads.to(device, dtype), angles.cos().to(device, dtype), angles.sin().to(device, dtype)
    try:
        normed, total = rms_norm(norm, x, delta)
        got = (normed, mlp(block, normed), rotate(heads, cos, sin))
    except Exception as error:  # noqa: BLE001 (any failure to build or run: the torch ops serve)
        return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    rotated = heads * cos[:, :, None] + torch.cat([-heads[..., 16:], heads[..., :16]], -1) * sin[:, :, None]
    expected = (norm(x + delta), block(normed), rotated.transpose(1, 2))
    for name, a, b in zip(("norm", "mlp", "rotation"), got, expected, strict=True):
        if not torch.allclose(a.float(), b.float(), rtol=3e-2, atol=3e-2):
            return f"the fused {name} is off by {float((a.float() - b.float()).abs().max()):.3g}"
    return None
