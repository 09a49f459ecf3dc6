"""The 4-bit products give the same bits on every instruction set: run after changing quantised_products.cpp.

Builds csrc/quantised_products.cpp alone for this CPU (-march=native), AVX-512 without VNNI (skylake-avx512),
AVX2 (haswell) and plain x86-64, and compares each build's products, and the documented order's emulation
(tests/test_int4.py's q4_reference), on several shapes and row counts. Needs an x86-64 CPU that runs
all four (any with AVX-512). A few minutes: four builds.

    .venv/bin/python benchmarks/q4_isas.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch.utils import cpp_extension

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from test_int4 import products_reference, q4_linear, q4_reference  # noqa: E402
from test_row_attention import q8_weight  # noqa: E402

from tokenswift_cli.backends.cpu.int4 import Int4Linear  # noqa: E402
from tokenswift_cli.backends.cpu.q8_head import Q8Head  # noqa: E402

BINDING = """#include <torch/extension.h>
at::Tensor q4_products(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales, const at::Tensor& lows,
                       const std::optional<at::Tensor>& bias, int64_t n_out);
at::Tensor q8_products(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales, int64_t n_out);
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("q4_products", &q4_products);
  m.def("q8_products", &q8_products);
}
"""
ARCHES = ("native", "skylake-avx512", "haswell", "x86-64")


def products(build: Any, weights: Int4Linear | Q8Head, x: torch.Tensor) -> torch.Tensor:
    """The products of the first 1, 2, 3 and 9 rows (the kernel's row tiles), one after the other."""
    if isinstance(weights, Q8Head):
        return torch.cat(
            [build.q8_products(x[:n], weights.packed, weights.scales, weights.vocab) for n in (1, 2, 3, 9)]
        )
    layer = (weights.packed, weights.scales, weights.lows, None, weights.out_features)
    return torch.cat([build.q4_products(x[:n], *layer) for n in (1, 2, 3, 9)])


def main() -> None:
    torch.set_num_threads(1)
    csrc = ROOT / "src/tokenswift_cli/backends/cpu/csrc"
    with tempfile.TemporaryDirectory() as folder:
        binding = Path(folder) / "binding.cpp"
        binding.write_text(BINDING)
        builds = {
            arch: cpp_extension.load(
                name=f"q4_isa_{arch.replace('-', '_')}",
                sources=[str(csrc / "quantised_products.cpp"), str(csrc / "parallel.cpp"), str(binding)],
                extra_cflags=["-O3", f"-march={arch}", "-ffp-contract=off"],
                build_directory=folder,
            )  # fmt: skip
            for arch in ARCHES
        }
    same = True
    cases: list[tuple[Int4Linear | Q8Head, int]] = []
    for outputs, inputs in ((64, 576), (37, 96), (20, 1536), (8, 32)):
        cases.append((Int4Linear.from_linear(q4_linear(outputs, inputs, seed=outputs))[0], inputs))
        head = Q8Head.from_weight(q8_weight(outputs + 3, inputs, seed=outputs))
        assert head is not None
        cases.append((head, inputs))
    for weights, inputs in cases:
        x = torch.randn(9, inputs, generator=torch.Generator().manual_seed(1)) * 3
        if isinstance(weights, Q8Head):
            reference, outputs, kind = (
                products_reference(x, weights.values(), weights.group_scales()),
                weights.vocab,
                "Q8_0",
            )
        else:
            reference, outputs, kind = q4_reference(x, weights), weights.out_features, "Q4_1"
        results = {arch: products(build, weights, x) for arch, build in builds.items()}
        equal = {arch: bool(torch.equal(out, results["native"])) for arch, out in results.items()}
        off = int((results["native"][:1] != reference[:1]).sum())
        same = same and all(equal.values())
        print(f"{kind} {outputs} x {inputs}: the same bits as native: {equal}; differing from the emulation: {off}")
    print("every build gives the same bits" if same else "BUILDS DIFFER")
    sys.exit(0 if same else 1)


if __name__ == "__main__":
    main()
