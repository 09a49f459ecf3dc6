"""Every instruction-set build of the kernels gives the same bits: a run resumes to the same text on another CPU.

Each build this CPU can run (AVX-512 with VNNI but no BF16, as an Intel Xeon; AVX-512 without VNNI; AVX2,
as most laptops; portable x86-64) computes `isa_battery.py` in a process of its own (TOKENSWIFT_ISA), and
its products and texts must equal this process's (the native build: here with `vdpbf16ps` and VNNI where
the CPU has them). A build takes a minute or two.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from isa_battery import battery

from tokenswift_cli.backends.cpu import kernels

pytestmark = pytest.mark.skipif(not kernels.available(), reason="no C++ kernels")
NARROWER = [name for name in kernels.ISAS if name != "native"]


@pytest.fixture(scope="module")
def native() -> dict[str, torch.Tensor]:
    return battery()


def test_the_native_build_writes_plain_decodings_text(native: dict[str, torch.Tensor]) -> None:
    for key in (k for k in native if k.endswith("-plain")):
        assert torch.equal(native[key], native[key.replace("-plain", "-tokenswift")]), key


@pytest.mark.parametrize("isa", NARROWER)
def test_a_narrower_build_gives_the_native_builds_bits(
    isa: str, native: dict[str, torch.Tensor], tmp_path: Path
) -> None:
    if not kernels.isa_runs_here(isa):
        pytest.skip(f"this CPU cannot run the {isa} build")
    out = tmp_path / "battery.pt"
    tests = Path(__file__).parent
    env = {**os.environ, "TOKENSWIFT_ISA": isa, "PYTHONPATH": str(tests)}
    done = subprocess.run(
        [sys.executable, str(tests / "isa_battery.py"), str(out)], env=env, capture_output=True, text=True,
        timeout=1800, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    theirs = torch.load(out)
    assert theirs.keys() == native.keys()
    differ = [key for key in native if not torch.equal(native[key], theirs[key])]
    assert not differ, f"{isa}: other bits for {differ}"
