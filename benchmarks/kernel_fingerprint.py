"""A digest of the C++ row attention's outputs over many cases: run it before and after a kernel change
that must keep the bits (e.g. a new SIMD path), and compare the two digests.

    .venv/bin/python benchmarks/kernel_fingerprint.py
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from test_row_attention import CASES, KEPT_CASES, TREE, _case  # noqa: E402

from tokenswift_cli.backends.cpu import row_attention as ra  # noqa: E402


def main() -> None:
    torch.set_num_threads(1)
    digest, count = hashlib.sha256(), 0
    for committed, window, first_recent, kept in [(*c, 4) for c in CASES] + KEPT_CASES:
        for dim in (64, 32, 128):
            for storage in ("float32", "float16"):
                for scaling in (0.2, 3.0, 40.0):  # 40: scores fall below exp's clamp
                    for seed in (0, 1):
                        query, sink_query, keys, values, sinks = _case(
                            committed, window, first_recent, seed=seed, dim=dim, kept=kept
                        )
                        if storage == "float16":
                            keys, values = keys.half(), values.half()
                        layout = ra.RowLayout.build(
                            committed + TREE.depths, committed, TREE.mask, window=window, sinks=sinks,
                            first_recent=first_recent or sinks, block=64,
                        )  # fmt: skip
                        out = ra.row_attention(query, keys, values, layout, scaling=scaling, sink_query=sink_query)
                        digest.update(out.numpy().tobytes())
                        count += 1
    print(f"{count} cases, sha256 {digest.hexdigest()}")


if __name__ == "__main__":
    main()
