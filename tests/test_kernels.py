"""The kernels' build cache: one build per sources, flags, torch, CPU and compiler; a notice only when it builds."""

from __future__ import annotations

import logging
from pathlib import Path
from types import ModuleType

import pytest
from torch.utils import cpp_extension

from tokenswift_cli.backends.cpu import kernels


def test_the_build_name_changes_with_the_cpu_and_the_compiler(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernels, "cpu_identity", lambda: "fpu sse2 avx2")
    monkeypatch.setattr(kernels, "compiler_identity", lambda: "c++: c++ (Debian 12.2.0-14) 12.2.0")
    first = kernels.build_name()
    assert kernels.build_name() == first
    monkeypatch.setattr(kernels, "cpu_identity", lambda: "fpu sse2 avx2 avx512f")
    other_cpu = kernels.build_name()
    monkeypatch.setattr(kernels, "compiler_identity", lambda: "c++: clang version 18.1.8")
    other_compiler = kernels.build_name()
    assert len({first, other_cpu, other_compiler}) == 3


def test_the_identities_read_this_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    assert kernels.cpu_identity().strip()
    monkeypatch.setenv("CXX", "no-such-compiler-here")
    assert kernels.compiler_identity() == "no-such-compiler-here"  # the build will fail and say why
    monkeypatch.setenv("CXX", "c++")
    assert kernels.compiler_identity().startswith("c++: ")


def test_one_notice_when_it_builds_none_when_cached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("TOKENSWIFT_CACHE", str(tmp_path))
    monkeypatch.delenv("TOKENSWIFT_NO_KERNEL", raising=False)
    monkeypatch.setattr(cpp_extension, "load", lambda **kw: ModuleType(kw["name"]))  # the build, not run
    with caplog.at_level(logging.WARNING, logger=kernels.__name__):
        kernels.load.__wrapped__()
        assert [r.getMessage()[:34] for r in caplog.records] == ["building the C++ kernels for this "]
        caplog.clear()
        name = kernels.build_name()
        (tmp_path / "kernels" / name / f"{name}.so").touch()  # as the build leaves it
        kernels.load.__wrapped__()
        assert caplog.records == []
