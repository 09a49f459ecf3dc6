"""A GGUF file's weights as they are (`--weights gguf`): linear layers and embeddings that read its blocks.

A GGUF file stores each weight row as blocks of 32 or 256 weights (Q4_K, Q6_K, Q5_0, Q8_0, ... :
`csrc/blocks_legacy.h`, `csrc/blocks_k.h`). `BlockLinear` keeps a tensor's rows as the file's bytes
(a view of the mapped file, nothing copied) and multiplies them by 8-bit activations in integers
(`csrc/block_products.cpp`); `BlockEmbedding` de-quantises only the rows a forward looks up (gguf's
own de-quantisation). A row's result depends on that row alone, so TokenSwift's verified tree gives
plain decoding's bits.

`ARITHMETIC` names this arithmetic; runs record it (`dense_arithmetic` names the rest).
"""

from __future__ import annotations

import warnings

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize

from tokenswift_cli.backends.cpu import kernels

# The block types the kernels read (a Q4_K_M file mixes Q4_K with Q6_K, and Q5_0/Q8_0 where a row is not
# a multiple of 256 wide).
KERNEL_TYPES = tuple(
    GGMLQuantizationType[name] for name in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K")
)
ARITHMETIC = "gguf-blocks-2026-12: 8-bit activations per block, integer products"


def compute_dtype(module: torch.nn.Module) -> torch.dtype:
    """The dtype a model's embedding or head computes in: float32 for blocks, else its weight's."""
    return torch.float32 if isinstance(module, BlockLinear | BlockEmbedding) else module.weight.dtype


def supported(kind: GGMLQuantizationType) -> bool:
    return kind in KERNEL_TYPES


def row_bytes(kind: GGMLQuantizationType, width: int) -> int:
    """Bytes of one row of `width` weights of block type `kind`."""
    elements, size = GGML_QUANT_SIZES[kind]
    if width % elements:
        raise ValueError(f"{kind.name} rows hold multiples of {elements} weights, not {width}")
    return width // elements * size


def as_rows(data: np.ndarray, kind: GGMLQuantizationType, width: int) -> torch.Tensor:
    """A tensor's bytes (a view of the mapped file, read-only) as `[rows, bytes per row]` uint8, not copied."""
    flat = data.reshape(-1).view(np.uint8)
    with warnings.catch_warnings():  # the mapping is read-only, and nothing here writes to it
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(flat).view(-1, row_bytes(kind, width))


def dequantized(rows: torch.Tensor, kind: GGMLQuantizationType) -> torch.Tensor:
    """The float32 weights `[rows, width]` of block rows (gguf's de-quantisation: the file's own values)."""
    values = dequantize(rows.numpy(), kind)
    return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32))


class BlockLinear(torch.nn.Module):
    """A linear layer reading a GGUF tensor's blocks; input, output and bias in float32."""

    def __init__(self, rows: torch.Tensor, kind: GGMLQuantizationType, in_features: int, bias: torch.Tensor | None):
        super().__init__()
        if not supported(kind):
            raise ValueError(f"no kernel for GGUF block type {kind.name}")
        self.kind, self.in_features, self.out_features = kind, in_features, rows.shape[0]
        self.register_buffer("rows", rows, persistent=False)  # a view of the mapped file: never saved
        self.register_buffer("bias", None if bias is None else bias.detach().float().contiguous(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).float()
        y = kernels.load().block_products(flat, self.rows, int(self.kind), self.bias)
        return y.to(x.dtype).view(*x.shape[:-1], self.out_features)

    def dense_weight(self) -> torch.Tensor:
        """The float32 weights `[out, in]` (for checks and the dense comparison)."""
        return dequantized(self.rows, self.kind)

    def extra_repr(self) -> str:
        return f"{self.in_features} -> {self.out_features}, {self.kind.name}"


class BlockEmbedding(torch.nn.Module):
    """An embedding table kept as GGUF blocks; a lookup de-quantises the rows it reads."""

    def __init__(self, rows: torch.Tensor, kind: GGMLQuantizationType, embedding_dim: int):
        super().__init__()
        self.kind = kind
        self.register_buffer("rows", rows, persistent=False)
        self.num_embeddings, self.embedding_dim = rows.shape[0], embedding_dim

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        flat = ids.reshape(-1).cpu()
        unique, where = torch.unique(flat, return_inverse=True)
        values = dequantized(self.rows[unique], self.kind)[where]
        return values.view(*ids.shape, self.embedding_dim).to(ids.device)
