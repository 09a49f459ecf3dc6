"""Every Triton kernel variant a GPU run can select compiles for sm_90 (H100/H200), here, without a GPU.

The interpreter tests (test_attention_kernel.py) check the kernels' bits but never compile them: a float64
`tl.dot` variant once passed them all and failed to build on the GPU. A passing catalog is remembered in
pytest's cache under a digest of the kernels' sources and Triton's version, so an unchanged tree does not
compile it twice; a fresh clone (CI) always compiles.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tokenswift_cli.backends.cuda import attention_kernel, layer_kernels, variants

triton = pytest.importorskip("triton")


def _digest() -> str:
    sources = [Path(module.__file__).read_bytes() for module in (attention_kernel, layer_kernels, variants)]
    return hashlib.sha256(b"".join(sources) + triton.__version__.encode()).hexdigest()


def test_every_kernel_variant_compiles_for_sm90(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    cache, key = request.config.cache, _digest()
    if cache is not None and cache.get("tokenswift/sm90-compiled", None) == key:
        return  # these very sources compiled before, with this Triton
    report = tmp_path / "variants.json"
    command = [sys.executable, "-m", "tokenswift_cli.backends.cuda.variants", "--workers", "1", "--json", str(report)]
    done = subprocess.run(command, env={**os.environ, "TRITON_INTERPRET": "0"}, capture_output=True, text=True)
    outcomes = json.loads(report.read_text())["outcomes"] if report.exists() else []
    failed = [f"{o['label']}: {o['error']}" for o in outcomes if not o["ok"]]
    assert done.returncode == 0 and not failed, "\n".join(failed) or done.stderr[-3000:]
    labels = [o["label"] for o in outcomes]
    for shape_dim in ("HEAD_DIM=64", "HEAD_DIM=128"):  # the embedded model's heads and the 8B's
        for dot in ("USE_DOT=False", "USE_DOT=True"):
            assert any(shape_dim in label and dot in label for label in labels), (shape_dim, dot)
    tensor_cores = [o for o in outcomes if "USE_DOT=True" in o["label"]]
    assert all(o["notes"]["fp64_mma"] > 0 for o in tensor_cores)  # float64 tensor cores, not a fallback
    assert {label.split("[")[0] for label in labels} == {"split", "combine", "norm", "rope", "silu"}
    if cache is not None:
        cache.set("tokenswift/sm90-compiled", key)


def test_the_catalog_holds_every_launch_the_backend_makes() -> None:
    """Each attention call's constants (rows 1..64, any capacity) are a catalogued variant's, up to the splits."""
    catalogued = {
        tuple((k, v) for k, v in variant.constants if k != "SPLITS")
        for variant in variants.catalog(["smollm2-135m", "llama-3.1-8b"], ["bfloat16"])
        if variant.kernel == "split"
    }
    for name in ("smollm2-135m", "llama-3.1-8b"):
        shape = variants.SHAPES[name]
        for rows in range(1, variants.ROWS + 1):
            for capacity in (16, 700, 4096, 70_000):
                launch = attention_kernel.Launch.of(
                    q_rows=rows, group=shape.heads // shape.kv_heads, kv=shape.kv_heads, head_dim=shape.head_dim,
                    capacity=capacity, dot=rows > attention_kernel.KERNEL_ROWS,
                )  # fmt: skip
                constants = launch.split_constants(sinks=rows == 1, cache_mask=False)
                assert tuple((k, v) for k, v in constants.items() if k != "SPLITS") in catalogued
