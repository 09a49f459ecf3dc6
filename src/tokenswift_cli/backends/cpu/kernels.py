"""The C++ kernels (csrc/), built with the machine's compiler on first use and cached.

torch's extension loader compiles them with ninja (about a minute) into the cache folder, keyed by
the sources (their bytes and where they are), flags, torch version, the CPU and the compiler; a later
process loads the cached build at once. Without a compiler `available()` is False, a warning is
logged once, and the callers keep their torch code.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import logging
import os
import platform
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import torch

from tokenswift_cli.paths import cache_dir

SOURCES = tuple(
    Path(__file__).with_name("csrc") / n
    for n in (
        "parallel.cpp",
        "row_attention.cpp",
        "q8_attention.cpp",
        "quantised_products.cpp",
        "dense_products.cpp",
        "block_products.cpp",
        "decoder.cpp",
        "scores.cpp",
        "bindings.cpp",
    )
)
HEADERS = tuple(
    Path(__file__).with_name("csrc") / n
    for n in ("simd.h", "parallel.h", "row_blocks.h", "blocks.h", "blocks_legacy.h", "blocks_k.h")
)
# -ffp-contract=off: the compiler fuses no multiply-add on its own (see row_attention.cpp)
BASE_FLAGS = ("-O3", "-fopenmp", "-ffp-contract=off")
# The instruction sets a build may target (TOKENSWIFT_ISA): every one gives the same bits (each kernel
# documents its one order), so the narrower ones are there to prove it on one machine (tests/test_isas.py).
# name -> (gcc's -march, the /proc/cpuinfo flags a CPU needs to run it)
ISAS = {
    "native": ("native", ()),
    "avx512-vnni": ("icelake-server", ("avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512vbmi")),  # no BF16
    "avx512": ("skylake-avx512", ("avx512f", "avx512bw", "avx512vl")),  # no VNNI
    "avx2": ("haswell", ("avx2", "fma", "f16c")),  # most laptops
    "portable": ("x86-64", ()),  # SSE2: the compiler's own lanes
}
log = logging.getLogger(__name__)


def isa() -> str:
    """The instruction set the kernels are built for: $TOKENSWIFT_ISA, else `native` (this CPU's)."""
    name = os.environ.get("TOKENSWIFT_ISA", "native") or "native"
    if name not in ISAS:
        raise RuntimeError(f"TOKENSWIFT_ISA={name}: not one of {', '.join(ISAS)}")
    return name


def isa_runs_here(name: str) -> bool:
    """Whether this CPU has the instructions of build `name` (x86 only for all but `native`)."""
    if name == "native":
        return True
    if platform.machine() not in ("x86_64", "AMD64"):
        return False
    flags = set(cpu_identity().split())
    return all(flag in flags for flag in ISAS[name][1])


def flags() -> tuple[str, ...]:
    """The compiler's flags for the chosen instruction set."""
    return (*BASE_FLAGS, f"-march={ISAS[isa()][0]}")


def available() -> bool:
    """Whether the kernels are built (or build now); False, with a warning logged once, if they cannot."""
    try:
        load()
    except Exception as error:  # a missing compiler, headers or ninja: keep the torch implementations
        _warn_once(str(error).strip().splitlines()[-1] if str(error).strip() else type(error).__name__)
        return False
    return True


@functools.cache
def _warn_once(reason: str) -> None:
    log.warning("the C++ kernels did not compile (%s); using the slower torch code", reason)


def cpu_identity() -> str:
    """The CPU's instruction sets (what -march=native compiles for): its flags in /proc/cpuinfo, else its name."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as info:
            for line in info:
                if line.startswith(("flags", "Features")):  # x86, ARM
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return f"{platform.machine()} {platform.processor()}"


def compiler_identity() -> str:
    """The compiler torch builds with ($CXX, else c++) and the first line of its `--version`."""
    command = os.environ.get("CXX", "c++")
    try:
        done = subprocess.run(
            [*shlex.split(command), "--version"], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, ValueError, subprocess.SubprocessError):
        return command  # no compiler: the build fails and says why
    return f"{command}: {(done.stdout.strip().splitlines() or [''])[0]}"


def build_name() -> str:
    """The cached build's name: a digest of everything that makes another build."""
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in (*SOURCES, *HEADERS)) + " ".join(flags()).encode())
    digest.update(torch.__version__.encode())
    # ninja's build file names the sources by path: two checkouts sharing one folder would rebuild
    # each other's kernels at every load
    digest.update(str(SOURCES[0].parent.resolve()).encode())
    # -march=native: a home folder shared by two machines must not load a build with instructions
    # the other CPU lacks, nor one from another compiler
    digest.update(f"\0{cpu_identity()}\0{compiler_identity()}".encode())
    return f"tokenswift_kernels_{digest.hexdigest()[:12]}"


def build_dir() -> Path:
    """The cache folder of this build."""
    return cache_dir() / "kernels" / build_name()


@functools.cache
def load() -> ModuleType:
    """The compiled module (built first if needed)."""
    from torch.utils import cpp_extension

    if os.environ.get("TOKENSWIFT_NO_KERNEL"):
        raise RuntimeError("TOKENSWIFT_NO_KERNEL is set")
    if not isa_runs_here(isa()):
        raise RuntimeError(f"TOKENSWIFT_ISA={isa()}: this CPU lacks its instructions")
    scripts = str(Path(sys.executable).parent)  # the `ninja` package's binary, when the venv is not on PATH
    if shutil.which("ninja") is None and shutil.which("ninja", path=scripts):
        os.environ["PATH"] = scripts + os.pathsep + os.environ.get("PATH", "")
    build = build_dir()
    build.mkdir(parents=True, exist_ok=True)
    if not (build / f"{build.name}.so").is_file():
        log.warning("building the C++ kernels for this CPU and compiler once (a minute or two) in %s", build)
    with _exclusive(build / ".tokenswift-lock"):
        # torch's own lock (the file `lock`, held while it builds or checks the build) outlives a
        # process killed meanwhile, and every later load would wait for it forever. Under this
        # flock, which the kernel drops with its process, no other load holds it: it is stale.
        (build / "lock").unlink(missing_ok=True)
        return cpp_extension.load(
            name=build.name, sources=[str(p) for p in SOURCES], extra_cflags=list(flags()), extra_ldflags=["-fopenmp"],
            build_directory=str(build), verbose=False,
        )  # fmt: skip


@contextlib.contextmanager
def _exclusive(path: Path) -> Iterator[None]:
    """An exclusive `flock` on `path`, waiting for another process's load to finish."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
