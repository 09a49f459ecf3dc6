"""Row-exact dense products: a row gets the same bits however many rows came with it, on any CPU.

A BLAS picks its kernel, and so the order of its sums, by the shape of the product and by the CPU, so
a row's result could change with the batch it rides in (one CPU's measured kernels were all that kept
verification equal to plain decoding before; issue 60). Here every product whose rows must stand
alone (the linear layers of an exact forward, the output head, the bfloat16 exact attention's scores
and values) runs one documented order per output: the C++ kernels (`csrc/dense_products.cpp`, float32
fmas over 16 lanes, the same bits on every instruction set), or without a compiler the torch code
below, which keeps the order by elementwise operations only (other bits than the kernels', also the
same for every batch).
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from tokenswift_cli.backends.cpu import kernels

LANES = 16
EARLIER = "blas"  # runs written before 2026-12-07: products of 4-16 rows through torch's BLAS (rows.py)


@functools.cache
def _kernels() -> object | None:
    return kernels.load() if kernels.available() else None


def arithmetic() -> str:
    """The name of the dense products' arithmetic, recorded with a run (a resume under another says so)."""
    return "fma16-2026-12" if _kernels() is not None else "torch-elementwise16-2026-12"


def used_by(backend: Any) -> bool:
    """Whether a backend's forwards run dense products here: a CPU model with a dense layer or output head."""
    if backend.device.type != "cpu":
        return False
    dense_layers = any(type(m) is torch.nn.Linear for m in backend.decoder.layers.modules())
    return dense_layers or backend.q8_head is None


def row_products(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`[G or 1, R, K]` times `[G, N, K]` -> `[G, R, N]` float32: y = sum_k x[r, k] w[n, k] (+ bias[n])."""
    built = _kernels()
    if built is not None and x.device.type == "cpu":
        return built.dense_row_products(_k_contiguous(x), _k_contiguous(w), bias)  # type: ignore[attr-defined]
    return _row_products_torch(x, w, bias)


def column_products(x: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """`[G, R, K]` times `[G, K, N]` -> `[G, R, N]` float32: y = sum_k x[r, k] v[k, n], k ascending."""
    built = _kernels()
    if built is not None and x.device.type == "cpu":
        return built.dense_column_products(x, _k_contiguous(v))  # type: ignore[attr-defined]
    return _column_products_torch(x, v)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`x @ weight.T + bias` for `x` `[..., K]`, each row on its own; the result in `x`'s dtype."""
    rows = x.reshape(1, -1, x.shape[-1])  # [1, R, K]
    y = row_products(rows, weight[None], bias)[0]  # [R, N] float32
    return y.to(x.dtype).reshape(*x.shape[:-1], weight.shape[0])


def apply(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """`module(x)` with its dense linear layers row-exact (a linear layer, or the families' gated MLP).

    Other modules (the 4-bit layers) compute each row on its own already. A module whose weights
    accelerate brings in at each call (offloaded layers) gets them through its hook, as in `module(x)`.
    """
    hook = getattr(module, "_hf_hook", None)
    if hook is not None:
        (x,), _ = hook.pre_forward(module, x)
        return hook.post_forward(module, _apply(module, x))
    return _apply(module, x)


def _apply(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    if type(module) is torch.nn.Linear:
        return linear(x, module.weight, module.bias)
    down = getattr(module, "down_proj", None)
    if type(down) is torch.nn.Linear:  # llama / qwen2 / mistral: down(act(gate(x)) * up(x))
        gate, up = apply(module.gate_proj, x), apply(module.up_proj, x)  # type: ignore[arg-type]
        return linear(module.act_fn(gate) * up, down.weight, down.bias)  # type: ignore[operator]
    return module(x)


def _k_contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def _row_products_torch(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The kernel's lanes and fold by elementwise float32 operations (a multiply and an add where it fmas)."""
    size = x.shape[-1]
    pad = -size % LANES
    xf = torch.nn.functional.pad(x.float(), (0, pad)).unflatten(-1, (-1, LANES))  # [G, R, C, 16]
    wf = torch.nn.functional.pad(w.float(), (0, pad)).unflatten(-1, (-1, LANES))  # [G, N, C, 16]
    acc = torch.zeros(w.shape[0], x.shape[1], w.shape[1], LANES, device=x.device)  # [G, R, N, 16]
    for c in range(xf.shape[2]):
        acc += xf[:, :, None, c] * wf[:, None, :, c]
    for half in (8, 4, 2, 1):  # simd::fold's tree: lane l + lane (l + half)
        acc = acc[..., :half] + acc[..., half : 2 * half]
    y = acc[..., 0]
    return y + bias.float() if bias is not None else y


def _column_products_torch(x: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    xf, vf = x.float(), v.float()
    y = torch.zeros(v.shape[0], x.shape[1], v.shape[2], device=x.device)  # [G, R, N]
    for k in range(x.shape[2]):
        y += xf[:, :, k, None] * vf[:, None, k]
    return y
