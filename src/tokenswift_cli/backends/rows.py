"""Row-wise modules in products of fixed sizes: a row gets the same bits however many rows came with it.

Matrix-product kernels pick their accumulation order by the number of rows, so a row's result can
change with the batch it rides in. Verification must give a tree's tokens the bits plain decoding
gives them alone (batch-invariant), and the output head must give each row its own logits
whatever the batch; both apply their row-wise modules through `exact_rows`.
"""

from __future__ import annotations

import torch

EXACT_ROWS = 16  # the most rows per product (a product of more took another kernel on this CPU)
ROW_MULTIPLE = 4  # products of 1-3 rows (a plain step's) round differently on some CPUs: padded to 4


def exact_rows(module: torch.nn.Module, x: torch.Tensor, dim: int = 1) -> torch.Tensor:
    """`module` applied to `x` (rows along `dim`) in products of 4, 8, 12 or 16 rows (row-wise modules).

    Measured on an AMD EPYC with AVX-512: a float32 linear layer gives a row the same bits in
    products of 4, 8, 12 and 13-16 rows, other bits in products of 1-3, 5-7 and 9-11; a bfloat16
    one (1536 -> 576) other bits in a product of one row. Zero rows pad each product up to a
    multiple of `ROW_MULTIPLE`.
    """
    parts = []
    for part in x.split(EXACT_ROWS, dim=dim):
        rows = part.shape[dim]
        short = -rows % ROW_MULTIPLE
        if short:
            pad = list(part.shape)
            pad[dim] = short
            part = torch.cat([part, part.new_zeros(pad)], dim=dim)
        parts.append(module(part).narrow(dim, 0, rows))
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=dim)
