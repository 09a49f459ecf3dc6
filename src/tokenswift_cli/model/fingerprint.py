"""Fingerprints of a model on disk: stable per folder or file, cheap (samples, not every byte)."""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
_VOLATILE_KEYS = ("_name_or_path", "transformers_version", "_commit_hash")  # who wrote it, not what


def folder_fingerprint(folder: Path) -> str:
    """sha256 over config.json and samples of every weight file: stable per folder, < 1 s."""
    h = hashlib.sha256(b"tokenswift-model-v1\0")
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    config = {k: v for k, v in config.items() if k not in _VOLATILE_KEYS}
    h.update(json.dumps(config, sort_keys=True).encode())
    for path in sorted(p for p in folder.iterdir() if p.suffix in _WEIGHT_SUFFIXES):
        h.update(f"\0{path.name}\0".encode() + file_digest(path))
    return h.hexdigest()


def file_digest(path: Path, size: int = 64) -> bytes:
    """Cheap content digest. safetensors: header + start, middle and end of every tensor (so a retrained
    tensor shows); other files: 16 evenly spaced 64 KiB chunks. O(tensors), not O(bytes) like sha256."""
    total = path.stat().st_size
    h = hashlib.sha256(str(total).encode())
    with path.open("rb") as f:
        if path.suffix == ".safetensors":
            (n,) = struct.unpack("<Q", f.read(8))
            h.update(header := f.read(n))
            spans = sorted(v["data_offsets"] for k, v in json.loads(header).items() if k != "__metadata__")
            starts = [(o, e) for b, e in spans for o in (b, (b + e) // 2, max(b, e - size))]
            reads = [(8 + n + o, min(size, e - o)) for o, e in starts]
        else:
            reads = [(max(0, total - (1 << 16)) * i // 15, 1 << 16) for i in range(16)]
        for offset, length in reads:
            f.seek(offset)
            h.update(f.read(length))
    return h.digest()
