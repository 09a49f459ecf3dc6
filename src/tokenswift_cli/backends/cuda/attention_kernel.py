"""`float64_attention` as two Triton kernels: the cache read as stored, every sum in float64 registers.

The torch version widens the whole cache to float64 and launches ~25 kernels a layer. Here one kernel
reads the keys and values in their own dtype, each program taking a split of the held keys (or the
new tokens' block) for a block of packed query rows, and a second combines the splits. The rule is
`float64_attention`'s: a score is the float64 sum of exact products rounded once to float32; weights
and their sums are float64, so the split, the key order and the number of rows move a result by
~1e-16 relative, under the rounding to the model's dtype. A row's bits therefore depend on its own
query and the keys it sees, whatever attends beside it: plain decoding and a verified tree agree.

How many keys the cache holds can be a device tensor, read by the kernels: a CUDA graph captured once
replays at any length. On CPU tensors the kernels run in Triton's interpreter (the tests' route).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Any

import torch

if not torch.cuda.is_available():  # Triton can only interpret here; its own helpers must be interpreted too
    os.environ.setdefault("TRITON_INTERPRET", "1")
try:  # optional: without it the padded backend attends through the torch version
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = tl = None

KERNEL_ROWS = 4  # forwards of at most this many rows attend here; more through the torch version (cuBLAS float64
# products): measured on an H200 (benchmarks/results/gpu-h200), these register-product kernels took 0.3-268 ms
# for 64 rows where the torch version took 0.13-1.5, and 0.1-1.3 ms for one row where it took 0.08-3.0.
ROW_BLOCKS = (4, 16)  # packed query rows a program takes: 4 for a plain step's heads, 16 beyond
KEY_BLOCK = 16  # keys per iteration of a program (its [rows, keys, head_dim] product sits in registers)
DOT_BLOCKS, DOT_KEY_BLOCK = (16, 64), 32  # the same with `tl.dot` (its tiles are at least 16 wide)
TARGET_PROGRAMS = 264  # two waves on a 132-SM Hopper: how many programs the splits aim at
MIN_SPLIT_KEYS = 256  # no split of the cache under this many keys of capacity


def runs_on(device: torch.device) -> bool:
    """Whether the kernels take tensors on `device`: CUDA compiled, or any tensors where Triton interprets."""
    return available() and (device.type == "cuda" or not torch.cuda.is_available())


def available() -> bool:
    """Whether the kernels can run: Triton compiles them for CUDA, or interprets them where there is none.

    Interpreting needs `TRITON_INTERPRET=1` before the first import of Triton (torch's compiler imports
    it too), so that Triton's own helpers (`tl.sum`, ...) are interpreted as well.
    """
    if triton is None:
        return False
    from triton.runtime.interpreter import InterpretedFunction

    return torch.cuda.is_available() or isinstance(tl.sum, InterpretedFunction)


def _rounded_fn(x, TO_BF16: tl.constexpr, dtype: tl.constexpr):  # type: ignore[no-untyped-def]
    """Float32 `x` in `dtype`, to nearest even (by hand for bfloat16: Triton's interpreter truncates that cast)."""
    if TO_BF16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        return bits.to(tl.uint16).to(tl.bfloat16, bitcast=True)
    return x.to(dtype)


def _pinned_fn(x):  # type: ignore[no-untyped-def]
    """Float64 `x` as it is, through an opaque move: `tl.dot` then sizes its operand as float64.

    Without it Triton traces a `tl.dot` operand back through its casts to the bfloat16 load, gives it a
    16-bit operand layout, and float64 tensor cores cannot take that on sm_90 ("Currently fp64 don't support
    largeK MMA", Triton 3.6): the kernel would not compile.
    """
    return tl.inline_asm_elementwise("mov.b64 $0, $1;", "=d,d", [x], dtype=tl.float64, is_pure=False, pack=1)


def _unpinned_fn(x):  # type: ignore[no-untyped-def]
    """The interpreter runs no assembly; it has no layouts to mislead either."""
    return x


# The kernels here and in layer_kernels.py find these among their module's globals, jitted.
rounded = triton.jit(_rounded_fn) if triton is not None else None
pinned = triton.jit(_unpinned_fn if triton.knobs.runtime.interpret else _pinned_fn) if triton is not None else None


def _split_kernel(  # type: ignore[no-untyped-def]
    q_ptr, sink_q_ptr, k_ptr, v_ptr, held_ptr, tree_vis_ptr, cache_vis_ptr, tree_sinks_ptr,
    m_ptr, l_ptr, acc_ptr,
    scaling, q_rows, group, tree_len, cache_sinks,
    s_qh, s_qr, s_kh, s_kn, s_vh, s_vn, s_tv, s_cv,
    SPLITS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    HEAD_DIM: tl.constexpr, HAS_SINKS: tl.constexpr, HAS_CACHE_MASK: tl.constexpr, USE_DOT: tl.constexpr,
):  # fmt: skip
    """One (row block, split, kv head): running max, weight sum and weighted values of its keys."""
    block, split, kv = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    packed = block * BLOCK_M + tl.arange(0, BLOCK_M)  # packed row = head-in-group * q_rows + row
    live = packed < group * q_rows
    head = kv * group + packed // q_rows
    row = packed % q_rows
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    q_at = head[:, None] * s_qh + row[:, None] * s_qr + d[None, :]
    q = tl.load(q_ptr + q_at, mask=live[:, None] & d_ok[None, :], other=0.0).to(tl.float64)
    if HAS_SINKS:
        sink_q = tl.load(sink_q_ptr + q_at, mask=live[:, None] & d_ok[None, :], other=0.0).to(tl.float64)
    held = tl.load(held_ptr)
    if split < SPLITS:  # a split of the held keys, sized from how many there are now
        per = ((held + SPLITS - 1) // SPLITS + BLOCK_N - 1) // BLOCK_N * BLOCK_N
        begin = split * per
        end = tl.minimum(begin + per, held)
    else:  # the new tokens' block
        begin = held
        end = held + tree_len
    m = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    total = tl.zeros((BLOCK_M,), tl.float64)
    acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float64)
    start = begin
    while start < end:  # (not `range`: Triton's interpreter cannot take a tensor bound under numpy 2.4)
        keys = start + tl.arange(0, BLOCK_N)
        k_ok = keys < end
        kd_ok = k_ok[:, None] & d_ok[None, :]
        k = tl.load(k_ptr + kv * s_kh + keys[:, None] * s_kn + d[None, :], mask=kd_ok, other=0.0).to(tl.float64)
        if USE_DOT:  # float64 tensor cores (DMMA on Hopper): exact products, float64 sums
            scores = tl.dot(pinned(q), pinned(tl.trans(k))).to(tl.float32) * scaling  # [rows, keys]
        else:
            scores = tl.sum(q[:, None, :] * k[None, :, :], axis=2).to(tl.float32) * scaling
        column = keys - held  # a key's column in the new tokens' block
        in_tree = k_ok & (column >= 0)
        if HAS_SINKS:
            if USE_DOT:
                sink_scores = tl.dot(pinned(sink_q), pinned(tl.trans(k))).to(tl.float32) * scaling
            else:
                sink_scores = tl.sum(sink_q[:, None, :] * k[None, :, :], axis=2).to(tl.float32) * scaling
            tree_sink = tl.load(tree_sinks_ptr + column, mask=in_tree, other=0) != 0
            is_sink = tl.where(in_tree, tree_sink, keys < cache_sinks)
            scores = tl.where(is_sink[None, :], sink_scores, scores)
        seen_tree = tl.load(
            tree_vis_ptr + row[:, None] * s_tv + column[None, :], mask=live[:, None] & in_tree[None, :], other=0
        ) != 0  # fmt: skip
        seen_cache = k_ok[None, :] & live[:, None]
        if HAS_CACHE_MASK:
            seen_cache = tl.load(
                cache_vis_ptr + row[:, None] * s_cv + keys[None, :], mask=seen_cache & ~in_tree[None, :], other=0
            ) != 0  # fmt: skip
        visible = tl.where(in_tree[None, :], seen_tree, seen_cache)
        scores = tl.where(visible, scores, float("-inf"))
        new_m = tl.maximum(m, tl.max(scores, 1))
        base = tl.where(new_m == float("-inf"), 0.0, new_m).to(tl.float64)  # rows that saw nothing yet
        rescale = tl.exp(m.to(tl.float64) - base)
        weights = tl.exp(scores.to(tl.float64) - base[:, None])  # exactly 0 where not visible
        v = tl.load(v_ptr + kv * s_vh + keys[:, None] * s_vn + d[None, :], mask=kd_ok, other=0.0).to(tl.float64)
        total = total * rescale + tl.sum(weights, 1)
        if USE_DOT:
            acc = acc * rescale[:, None] + tl.dot(pinned(weights), pinned(v))
        else:
            acc = acc * rescale[:, None] + tl.sum(weights[:, :, None] * v[None, :, :], axis=1)
        m = new_m
        start += BLOCK_N
    at = (kv * (SPLITS + 1) + split) * (tl.num_programs(0) * BLOCK_M) + packed
    tl.store(m_ptr + at, m)
    tl.store(l_ptr + at, total)
    tl.store(acc_ptr + at[:, None] * BLOCK_D + d[None, :], acc)


def _combine_kernel(  # type: ignore[no-untyped-def]
    m_ptr, l_ptr, acc_ptr, out_ptr, q_rows, group, s_or,
    SPLITS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, HEAD_DIM: tl.constexpr,
    OUT_IS_BF16: tl.constexpr,
):  # fmt: skip
    """One (row block, kv head): the splits' partial sums brought to one max, divided, rounded once."""
    block, kv = tl.program_id(0), tl.program_id(1)
    packed = block * BLOCK_M + tl.arange(0, BLOCK_M)
    live = packed < group * q_rows
    head = kv * group + packed // q_rows
    row = packed % q_rows
    d = tl.arange(0, BLOCK_D)
    padded_rows = tl.num_programs(0) * BLOCK_M
    top = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    for split in range(SPLITS + 1):
        top = tl.maximum(top, tl.load(m_ptr + (kv * (SPLITS + 1) + split) * padded_rows + packed))
    base = tl.where(top == float("-inf"), 0.0, top).to(tl.float64)
    total = tl.zeros((BLOCK_M,), tl.float64)
    acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float64)
    for split in range(SPLITS + 1):
        at = (kv * (SPLITS + 1) + split) * padded_rows + packed
        factor = tl.exp(tl.load(m_ptr + at).to(tl.float64) - base)
        total += tl.load(l_ptr + at) * factor
        acc += tl.load(acc_ptr + at[:, None] * BLOCK_D + d[None, :]) * factor[:, None]
    total = tl.where(live, total, 1.0)  # pad rows saw nothing (and are not stored)
    out = (acc / total[:, None]).to(tl.float32)  # float64 -> float32 -> dtype, as torch's `.to` rounds
    out = rounded(out, OUT_IS_BF16, out_ptr.dtype.element_ty)
    ok = live[:, None] & (d < HEAD_DIM)[None, :]
    tl.store(out_ptr + row[:, None] * s_or + head[:, None] * HEAD_DIM + d[None, :], out, mask=ok)


@functools.cache
def _kernels() -> tuple[Any, Any]:
    """The two kernels: compiled for CUDA, or interpreted where there is none (`TRITON_INTERPRET`)."""
    return triton.jit(_split_kernel), triton.jit(_combine_kernel)


@functools.cache
def agrees(device: torch.device, dtype: torch.dtype, *, dot: bool = False) -> str | None:
    """None if the kernels (`dot`: the tensor-core variant) give `float64_attention`'s bits on `device` in `dtype`
    (a small random case), else why not.

    Checked once per process before the padded backend relies on them: a Triton that cannot build
    them, or builds them otherwise, sends attention back to the torch version.
    """
    from tokenswift_cli.backends.cuda.float64_attention import float64_attention

    generator = torch.Generator().manual_seed(0)
    held, rows = 300, 9
    query, keys, values = (torch.randn(*shape, generator=generator).to(device, dtype) for shape in (
        (1, 6, rows, 64), (1, 2, held + rows, 64), (1, 2, held + rows, 64)))  # fmt: skip
    visible = torch.ones(rows, rows, dtype=torch.bool, device=device).tril()
    try:
        got = kernel_attention(query, keys, values, held, tree_visible=visible, scaling=0.125, dot=dot)
    except Exception as error:  # noqa: BLE001 (any failure to build or run: the torch version serves)
        return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    cache_k, cache_v = keys[:, :, :held], values[:, :, :held]
    expected = float64_attention(
        query, cache_k, cache_v, keys[:, :, held:], values[:, :, held:], tree_visible=visible, scaling=0.125
    )
    differing = int((got != expected).sum())
    return None if differing == 0 else f"{differing} of {got.numel()} values differ from float64_attention"


@dataclass(frozen=True)
class Launch:
    """How one attention call runs: its grid and the kernels' compile-time constants (`variants.py` lists them all)."""

    row_blocks: int
    splits: int
    block_m: int
    block_n: int
    block_d: int
    head_dim: int
    dot: bool

    @classmethod
    def of(cls, *, q_rows: int, group: int, kv: int, head_dim: int, capacity: int, dot: bool) -> Launch:
        blocks = DOT_BLOCKS if dot else ROW_BLOCKS
        block_m = blocks[0] if group * q_rows <= blocks[0] else blocks[1]
        row_blocks = -(-group * q_rows // block_m)
        return cls(
            row_blocks=row_blocks, splits=splits_for(capacity, kv, row_blocks), block_m=block_m,
            block_n=DOT_KEY_BLOCK if dot else KEY_BLOCK, block_d=max(16, 1 << (head_dim - 1).bit_length()),
            head_dim=head_dim, dot=dot,
        )  # fmt: skip

    def split_constants(self, *, sinks: bool, cache_mask: bool) -> dict[str, Any]:
        return {
            "SPLITS": self.splits, "BLOCK_M": self.block_m, "BLOCK_N": self.block_n, "BLOCK_D": self.block_d,
            "HEAD_DIM": self.head_dim, "HAS_SINKS": sinks, "HAS_CACHE_MASK": cache_mask, "USE_DOT": self.dot,
        }  # fmt: skip

    def combine_constants(self, *, out_is_bf16: bool) -> dict[str, Any]:
        return {
            "SPLITS": self.splits, "BLOCK_M": self.block_m, "BLOCK_D": self.block_d, "HEAD_DIM": self.head_dim,
            "OUT_IS_BF16": out_is_bf16,
        }  # fmt: skip


def splits_for(capacity: int, kv_heads: int, row_blocks: int) -> int:
    """How many splits the held keys get: enough programs to fill the GPU, none under `MIN_SPLIT_KEYS` keys."""
    by_size = max(1, capacity // MIN_SPLIT_KEYS)
    return max(1, min(by_size, TARGET_PROGRAMS // max(1, kv_heads * row_blocks)))


def kernel_attention(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    held: torch.Tensor | int,
    *,
    tree_visible: torch.Tensor,
    scaling: float,
    cache_visible: torch.Tensor | None = None,
    sink_query: torch.Tensor | None = None,
    cache_sinks: int = 0,
    tree_sinks: torch.Tensor | None = None,
    dot: bool = False,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention `[1, q, heads * d]` of rotated queries `[1, heads, q, d]`, as `float64_attention` computes it.

    `keys`/`values` `[1, kv, capacity, d]` are a cache's buffers: slots `[0, held)` are the held keys
    (`held` an int or a 0-dim device tensor), the next `tree_visible.shape[1]` the new tokens' block.
    `tree_visible` `[q, t]`, `cache_visible` `[q, >= held]` (None: all), sinks as in `float64_attention`.
    `dot`: the products on float64 tensor cores (`tl.dot`) rather than in registers, for many rows.
    `out` `[1, >= q, heads * d]`: written in its first q rows (the rest left as they are), and returned.
    """
    _, heads, q_rows, head_dim = query.shape
    kv, capacity = keys.shape[1], keys.shape[2]
    device = query.device
    launch = Launch.of(q_rows=q_rows, group=heads // kv, kv=kv, head_dim=head_dim, capacity=capacity, dot=dot)
    row_blocks, splits, block_m, block_d = launch.row_blocks, launch.splits, launch.block_m, launch.block_d
    if not isinstance(held, torch.Tensor):
        held = torch.tensor(held, dtype=torch.long, device=device)
    query = query if query.stride(3) == 1 else query.contiguous()  # rows and heads may be strided (a slice)
    sink_query = query if sink_query is None else sink_query.contiguous()
    tree_visible = tree_visible.contiguous()
    rows = kv * (splits + 1) * row_blocks * block_m
    m = torch.empty(rows, dtype=torch.float32, device=device)
    total = torch.empty(rows, dtype=torch.float64, device=device)
    acc = torch.empty(rows, block_d, dtype=torch.float64, device=device)
    if out is None:
        out = torch.empty(1, q_rows, heads * head_dim, dtype=query.dtype, device=device)
    split_kernel, combine_kernel = _kernels()
    mask = cache_visible.contiguous() if cache_visible is not None else tree_visible
    sinks = tree_sinks.contiguous() if tree_sinks is not None else tree_visible
    assert keys.stride(3) == values.stride(3) == 1 and keys.stride(0) == keys.shape[1] * keys.stride(1)
    split_kernel[(row_blocks, splits + 1, kv)](
        query, sink_query, keys, values, held, tree_visible, mask, sinks, m, total, acc,
        scaling, q_rows, heads // kv, tree_visible.shape[1], cache_sinks,
        query.stride(1), query.stride(2), keys.stride(1), keys.stride(2), values.stride(1), values.stride(2),
        tree_visible.stride(0), mask.stride(0),
        **launch.split_constants(sinks=sink_query is not query, cache_mask=cache_visible is not None),
    )  # fmt: skip
    combine_kernel[(row_blocks, kv)](
        m, total, acc, out, q_rows, heads // kv, out.stride(1),
        **launch.combine_constants(out_is_bf16=query.dtype == torch.bfloat16),
    )  # fmt: skip
    return out
