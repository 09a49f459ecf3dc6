"""Peak resident memory of a stretch of code, sampled by a background thread (Linux /proc, else ru_maxrss)."""

from __future__ import annotations

import resource
import sys
import threading
from pathlib import Path

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
