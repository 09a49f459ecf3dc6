"""Every Triton kernel variant a GPU run can select, and their compilation for sm_90 (H100/H200) on any machine.

Triton's interpreter runs a kernel's arithmetic but never compiles it, so a kernel the CPU tests pass can
still fail to build on the GPU. Here the variants come from the same launch rules the backend uses
(`attention_kernel.Launch`, the layer kernels' blocks) over every row count a forward can hold, every
cache capacity, sinks and masks, for the shapes GPU runs use, and each is compiled ahead of time for
`GPUTarget("cuda", 90, 32)` with Triton's bundled ptxas: `make test` does it (tests/test_sm90_compile.py).

    TRITON_INTERPRET=0 python -m tokenswift_cli.backends.cuda.variants --shapes smollm2-135m --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from typing import Any

SM90 = ("cuda", 90, 32)
ROWS = 64  # the padded backend's rows (`padded.ROWS`): a forward attends 1..ROWS of them
CAPACITIES = (16, 1 << 17)  # the fewest and most cache slots a run holds: the fewest and most splits


@dataclass(frozen=True)
class Shape:
    """What a model's shape fixes in the kernels."""

    heads: int
    kv_heads: int
    head_dim: int
    hidden: int
    intermediate: int


SHAPES = {  # the embedded model, the GPU plan's 8B and 7B shapes, and the backend's own probes (`agrees`, `usable`)
    "smollm2-135m": Shape(heads=9, kv_heads=3, head_dim=64, hidden=576, intermediate=1536),
    "llama-3.1-8b": Shape(heads=32, kv_heads=8, head_dim=128, hidden=4096, intermediate=14336),
    "qwen2.5-7b": Shape(heads=28, kv_heads=4, head_dim=128, hidden=3584, intermediate=18944),
    "probes": Shape(heads=6, kv_heads=2, head_dim=64, hidden=64, intermediate=96),
}
DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


@dataclass(frozen=True)
class Variant:
    """One kernel as Triton would build it: its argument types and compile-time constants."""

    kernel: str  # "split", "combine", "norm", "rope", "silu"
    signature: tuple[tuple[str, str], ...]
    constants: tuple[tuple[str, Any], ...]

    def label(self) -> str:
        shown = ",".join(f"{k}={v}" for k, v in self.constants)
        types = sorted({t for _, t in self.signature if t.startswith("*") and t not in ("*i1", "*i64")})
        return f"{self.kernel}[{'/'.join(types)}]({shown})"


@dataclass
class Outcome:
    label: str
    ok: bool
    seconds: float
    error: str = ""
    notes: dict[str, Any] = field(default_factory=dict)


def _split_signature(dtype: str) -> dict[str, str]:
    pointers = dict.fromkeys(("q_ptr", "sink_q_ptr", "k_ptr", "v_ptr"), f"*{dtype}")
    pointers |= {"held_ptr": "*i64", "tree_vis_ptr": "*i1", "cache_vis_ptr": "*i1", "tree_sinks_ptr": "*i1"}
    pointers |= {"m_ptr": "*fp32", "l_ptr": "*fp64", "acc_ptr": "*fp64", "scaling": "fp32"}
    ints = "q_rows group tree_len cache_sinks s_qh s_qr s_kh s_kn s_vh s_vn s_tv s_cv".split()
    return pointers | dict.fromkeys(ints, "i32")


def _combine_signature(dtype: str) -> dict[str, str]:
    types = {"m_ptr": "*fp32", "l_ptr": "*fp64", "acc_ptr": "*fp64", "out_ptr": f"*{dtype}"}
    return types | dict.fromkeys(("q_rows", "group", "s_or"), "i32")


def attention_variants(shape: Shape, dtype: str) -> list[Variant]:
    """The split and combine kernels of every attention call: rows 1..KERNEL_ROWS in registers, more on tensor
    cores, with and without sinks and a cache mask, at one split and at the most splits.

    The split count only bounds loops and picks a branch, so one split and the most (the GPU compiles each
    count it meets) stand for the counts between.
    """
    from tokenswift_cli.backends.cuda.attention_kernel import KERNEL_ROWS, Launch

    group = shape.heads // shape.kv_heads
    launches = [
        Launch.of(q_rows=rows, group=group, kv=shape.kv_heads, head_dim=shape.head_dim, capacity=capacity,
                  dot=rows > KERNEL_ROWS)
        for rows in range(1, ROWS + 1)
        for capacity in CAPACITIES
    ]  # fmt: skip
    most = {}  # the most splits of each block configuration
    for launch in launches:
        key = replace(launch, row_blocks=0, splits=0)
        most[key] = max(most.get(key, 1), launch.splits)
    out: list[Variant] = []
    for key, splits in most.items():
        for launch in {replace(key, splits=1), replace(key, splits=splits)}:
            for sinks in (False, True):
                for mask in (False, True):
                    constants = launch.split_constants(sinks=sinks, cache_mask=mask)
                    out.append(Variant("split", tuple(_split_signature(dtype).items()), tuple(constants.items())))
            constants = launch.combine_constants(out_is_bf16=dtype == "bf16")
            out.append(Variant("combine", tuple(_combine_signature(dtype).items()), tuple(constants.items())))
    return out


def layer_variants(shape: Shape, dtype: str) -> list[Variant]:
    """The fused norm (with and without the residual add), rotation and activation at `shape`'s widths."""
    from tokenswift_cli.backends.cuda.layer_kernels import SILU_BLOCK

    bf16 = dtype == "bf16"
    block = 1 << (shape.hidden - 1).bit_length()
    norm = dict.fromkeys(("x_ptr", "delta_ptr", "weight_ptr", "out_ptr", "sum_ptr"), f"*{dtype}")
    norm |= {"width": "i32", "eps": "fp32"}
    rope = dict.fromkeys(("x_ptr", "cos_ptr", "sin_ptr", "out_ptr"), f"*{dtype}")
    rope |= dict.fromkeys(("heads", "s_xr", "s_xh", "s_cr", "s_or", "s_oh"), "i32")
    silu = {"gate_up_ptr": f"*{dtype}", "out_ptr": f"*{dtype}", "width": "i32"}
    return [
        *(Variant("norm", tuple(norm.items()), (("HAS_DELTA", delta), ("BLOCK", block), ("TO_BF16", bf16)))
          for delta in (False, True)),
        Variant("rope", tuple(rope.items()), (("HALF", shape.head_dim // 2), ("TO_BF16", bf16))),
        Variant("silu", tuple(silu.items()), (("BLOCK", SILU_BLOCK), ("TO_BF16", bf16))),
    ]  # fmt: skip


def catalog(shapes: list[str], dtypes: list[str]) -> list[Variant]:
    """Every variant for `shapes` x `dtypes`, once each, with 16-byte-aligned pointers as the JIT sees a tensor's.

    Float32 attention is left to torch (`padded.py`), so only the layer kernels are built in float32.
    """
    found: dict[Variant, None] = {}
    for name in shapes:
        for dtype in (DTYPES[d] for d in dtypes):
            # the probes' attention differs from the embedded model's in its split counts only
            attention = attention_variants(SHAPES[name], dtype) if dtype != "fp32" and name != "probes" else []
            for variant in (*attention, *layer_variants(SHAPES[name], dtype)):
                found[variant] = None
    return list(found)


def compile_variant(variant: Variant) -> Outcome:
    """Build `variant` for sm_90: PTX and cubin through Triton's own ptxas, no GPU needed."""
    import triton
    from triton.backends.compiler import GPUTarget

    from tokenswift_cli.backends.cuda import attention_kernel, layer_kernels

    if triton.knobs.runtime.interpret:
        raise RuntimeError("set TRITON_INTERPRET=0: the interpreter never compiles")
    kernels = dict(zip(("split", "combine"), attention_kernel._kernels(), strict=True)) | layer_kernels._kernels()
    fn = kernels[variant.kernel]
    signature = dict(variant.signature) | {name: "constexpr" for name, _ in variant.constants}
    # the JIT's specialisation of a 16-byte-aligned pointer (every fresh tensor's)
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n, t in variant.signature if t[0] == "*"}
    started = time.perf_counter()
    try:
        source = triton.compiler.ASTSource(fn=fn, signature=signature, constexprs=dict(variant.constants), attrs=attrs)
        built = triton.compile(source, target=GPUTarget(*SM90))
    except Exception as error:  # noqa: BLE001 (the report names every failure)
        lines = [line for line in str(error).splitlines() if line.strip()]
        first = next((line for line in lines if "error" in line.lower() or "assert" in line.lower()), "")
        reason = f"{type(error).__name__}: {first or (lines[0] if lines else '')}"[:300]
        return Outcome(variant.label(), False, time.perf_counter() - started, reason)
    ptx = built.asm["ptx"]
    notes = {"ptx_lines": ptx.count("\n"), "fp64_mma": ptx.count("mma.sync.aligned.m16n8k16.row.col.f64"),
             "shared_bytes": built.metadata.shared}  # fmt: skip
    return Outcome(variant.label(), True, time.perf_counter() - started, notes=notes)


def compile_all(variants: list[Variant], *, workers: int) -> list[Outcome]:
    if workers <= 1:
        return [compile_variant(v) for v in variants]
    with ProcessPoolExecutor(workers) as pool:
        return list(pool.map(compile_variant, variants, chunksize=4))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="smollm2-135m,llama-3.1-8b,probes")
    parser.add_argument("--dtypes", default="bfloat16,float16,float32")
    parser.add_argument("--workers", type=int, default=min(4, os.cpu_count() or 1))
    parser.add_argument("--json", help="write every outcome here")
    args = parser.parse_args(argv)
    os.environ["TRITON_INTERPRET"] = "0"  # before Triton loads: compile, never interpret
    variants = catalog(args.shapes.split(","), args.dtypes.split(","))
    started = time.perf_counter()
    outcomes = compile_all(variants, workers=args.workers)
    failed = [o for o in outcomes if not o.ok]
    for outcome in failed:
        print(f"FAILED {outcome.label}: {outcome.error}")
    print(f"{len(outcomes) - len(failed)} of {len(outcomes)} kernel variants compiled for sm_90 "
          f"({args.shapes}; {args.dtypes}) in {time.perf_counter() - started:.0f} s")  # fmt: skip
    if args.json:
        with open(args.json, "w") as file:
            json.dump({"target": SM90, "outcomes": [asdict(o) for o in outcomes]}, file, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
