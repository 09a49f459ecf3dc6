"""Resident memory: its peak over a stretch of code (a sampling thread), and pages of mapped weights given back."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import resource
import sys
import threading
from pathlib import Path

import torch

_STATM = Path("/proc/self/statm")
_PAGE = resource.getpagesize()


def rss_mb() -> float:
    """Current resident set size in MiB (the process's lifetime peak where /proc is missing)."""
    try:
        return int(_STATM.read_text().split()[1]) * _PAGE / 2**20
    except OSError:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak / 2**20 if sys.platform == "darwin" else peak / 2**10


class PeakRss:
    """`with PeakRss() as peak: ...` then `peak.mb`: the largest RSS seen while the block ran."""

    def __init__(self, interval: float = 0.02) -> None:
        self.interval = interval
        self.mb = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while True:
            self.mb = max(self.mb, rss_mb())
            if self._stop.wait(self.interval):
                return

    def __enter__(self) -> PeakRss:
        self.mb = rss_mb()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.mb = max(self.mb, rss_mb())


# ---- weights read from a memory-mapped file ----
#
# transformers maps safetensors files into memory; a page of the file counts in the resident set once
# read. Putting the decoder on 4-bit weights reads every dense weight once and then drops it, but the
# mapping (kept alive by the embeddings) would keep all of them resident: 0.5 GB for the embedded model.

_MADV_DONTNEED = 4  # Linux and macOS


def in_ranges(tensor: torch.Tensor, ranges: list[tuple[int, int]]) -> bool:
    return any(lo <= tensor.data_ptr() < hi for lo, hi in ranges)


def mapped_file_ranges(suffix: str = ".safetensors") -> list[tuple[int, int]]:
    """Address ranges [start, end) where files named *suffix are mapped into this process (Linux)."""
    ranges = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/maps").read_text().splitlines():
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].endswith(suffix):
                start, end = (int(x, 16) for x in fields[0].split("-"))
                ranges.append((start, end))
    return ranges


def drop_pages(tensor: torch.Tensor, ranges: list[tuple[int, int]]) -> bool:
    """Give back the resident pages of a file-mapped `tensor` that nothing will read again.

    Only whole pages inside the tensor's bytes and inside one of `ranges` (see `mapped_file_ranges`):
    other memory is never touched. A page read again later is read again from the file.
    """
    if not tensor.is_contiguous():
        return False
    start = tensor.data_ptr()
    end = start + tensor.numel() * tensor.element_size()
    first, last = -(-start // _PAGE) * _PAGE, end // _PAGE * _PAGE
    if last <= first or not any(lo <= first and last <= hi for lo, hi in ranges) or libc() is None:
        return False
    return libc().madvise(ctypes.c_void_p(first), ctypes.c_size_t(last - first), _MADV_DONTNEED) == 0


@functools.cache
def libc() -> ctypes.CDLL | None:
    """The C library (found once: `find_library` runs `ldconfig`), or None where there is none."""
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name, use_errno=True) if name else None
    except OSError:
        return None


M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
LARGE_BLOCK = 1 << 20


def give_back_large_blocks() -> None:
    """Allocations of 1 MiB and more get their own mapping, returned to the system when freed (glibc).

    glibc raises that threshold up to 32 MiB once such a block is freed, after which a run's large
    temporaries (a checkpoint's buffers, a tree's scores) stay in the heap: ~30 MiB of a run's
    resident set (benchmarks/record/performance.md). Fixing it costs nothing measurable: a step's own
    temporaries are smaller.
    """
    c_library = libc()
    if c_library is not None and hasattr(c_library, "mallopt"):
        c_library.mallopt(M_MMAP_THRESHOLD, LARGE_BLOCK)


def trim() -> None:
    """Hand the allocator's free memory back to the system (glibc's malloc_trim; elsewhere nothing).

    Loading and prefilling free ~100-200 MiB of temporaries that glibc would otherwise keep for good.
    """
    c_library = libc()
    if c_library is not None and hasattr(c_library, "malloc_trim"):
        c_library.malloc_trim(0)
