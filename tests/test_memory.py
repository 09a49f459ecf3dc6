"""Memory given back: pages of a mapped weights file that nothing reads again leave the resident set."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from tokenswift_cli.model import memory

linux_only = pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="reads /proc/self/smaps")


def resident_kib(path: Path) -> int:
    """Resident KiB of this process's mappings of `path`."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split()
        if "-" in fields[0] and len(fields) >= 5 and fields[0][0] in "0123456789abcdef" and ":" in fields[3]:
            inside = line.endswith(str(path))
        elif inside and fields[0] == "Rss:":
            total += int(fields[1])
    return total


@linux_only
def test_dropped_pages_leave_the_resident_set_and_read_back_from_the_file(tmp_path: Path) -> None:
    path = tmp_path / "w.safetensors"
    weights = torch.randn(1024, 1024, generator=torch.Generator().manual_seed(0))  # 4 MiB
    save_file({"w": weights, "other": torch.ones(3)}, str(path))
    size = path.stat().st_size
    mapped = torch.from_file(str(path), shared=False, size=size, dtype=torch.uint8)
    assert int(mapped.sum()) > 0  # every page read
    before = resident_kib(path)
    assert before >= 4000
    ranges = memory.mapped_file_ranges()
    assert memory.in_ranges(mapped, ranges) and not memory.in_ranges(weights, ranges)
    assert memory.drop_pages(mapped[:1024], ranges) is False  # less than a whole page: nothing
    assert not memory.drop_pages(weights, ranges)  # not in a mapped file: never touched
    assert memory.drop_pages(mapped, ranges)
    assert resident_kib(path) < before / 8
    assert torch.equal(mapped, torch.frombuffer(bytearray(path.read_bytes()), dtype=torch.uint8))  # read again


@linux_only
def test_a_4bit_default_model_keeps_no_weights_file_mapped() -> None:
    from tokenswift_cli.config import ModelSpec
    from tokenswift_cli.model.loading import load_model

    before = set(memory.mapped_file_ranges())  # other tests' models may hold theirs
    loaded = load_model(ModelSpec())  # the CLI's default: 4-bit decoder (a Q4 GGUF)
    assert loaded.spec is not None and loaded.spec.weights == "int4"
    after = memory.mapped_file_ranges()
    assert set(after) <= before  # the embeddings and norms were copied out, the rest dropped
    tensors = [*loaded.model.parameters(), *loaded.model.buffers()]
    assert not any(memory.in_ranges(t, after) for t in tensors)


LARGE_FREES = """
import torch
from tokenswift_cli.model import memory
memory.give_back_large_blocks()
for size in (24, 16, 8):  # without the fix, freed blocks raise glibc's threshold; later ones land in the heap
    t = torch.ones(size << 18)  # size MiB of float32
    del t
base = memory.rss_mb()
kept = [torch.ones(2 << 18) for _ in range(8)]
t = torch.ones(6 << 18)
alive = [torch.ones(2 << 18) for _ in range(4)]  # 8 MiB allocated after them, still in use
del kept, t
print(memory.rss_mb() - base)
"""


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="reads RSS from /proc")
def test_large_blocks_go_back_to_the_system_when_freed() -> None:
    """Without the fixed threshold 16-18 MiB of the 22 freed stay resident here (fragmented heap)."""
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-c", LARGE_FREES], capture_output=True, text=True, check=True)
    assert float(result.stdout.strip()) <= 10.0  # the 8 MiB still alive, and little else
