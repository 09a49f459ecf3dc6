"""Checkpoints of a run: what exact resume needs (DESIGN.md, Checkpoints), written so a crash never
leaves half of one.

Layout of `run-NNN/checkpoint/`:

* `kv-SSSSSS.safetensors`: keys/values of the full cache for the positions committed since the
  previous checkpoint (`keys.{layer}`, `values.{layer}` as `[kv_heads, n, head_dim]`). The cache only
  grows at its end, so a checkpoint writes only what is new (append-only segments).
* `state-SSSSSS.safetensors`: the committed tokens, the partial cache's selected positions and the
  text stream's look-back window.
* `manifest.json`: the latest consistent snapshot: counters, statistics, fingerprints, and the size
  and sha256 of every file above. Written last (temporary file, fsync, rename), so until the rename
  the previous snapshot stays the valid one; it carries a checksum of its own content.

The n-gram table is not stored: it is rebuilt from the tokens (it is deterministic) and checked
against the stored counter. Torch is imported lazily: listing runs must not load it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from tokenswift_cli.runs.durable import CheckpointError, write_atomic, write_json_atomic
from tokenswift_cli.runs.textstream import StreamState

if TYPE_CHECKING:
    from collections.abc import Sequence

    import torch

    from tokenswift_cli.config import RunConfig
    from tokenswift_cli.engine.state import GenerationState

SCHEMA = 1
FOLDER = "checkpoint"
MANIFEST = "manifest.json"
SEGMENT = 512  # positions per KV file: ~23 MB for the embedded model


def _digest(data: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


# ---- reading ----


def read_manifest(run_dir: Path) -> dict[str, Any] | None:
    """The latest snapshot's manifest (its own checksum verified), or None when there is none yet."""
    path = run_dir / FOLDER / MANIFEST
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        body = {k: v for k, v in data.items() if k != "checksum"}
        valid = isinstance(data, dict) and data.get("checksum") == _digest(body)
    except (OSError, ValueError, AttributeError):
        valid = False
    if not valid:
        raise CheckpointError(f"the checkpoint manifest of {run_dir.name} is corrupted ({path})")
    if data.get("schema") != SCHEMA:
        raise CheckpointError(f"checkpoint schema {data.get('schema')} of {run_dir.name} is not supported")
    return cast(dict[str, Any], data)


def _read_verified(folder: Path, entry: dict[str, Any]) -> bytes:
    path = folder / str(entry["name"])
    try:
        data = path.read_bytes()
    except OSError as error:
        raise CheckpointError(f"checkpoint file {path} cannot be read ({error.strerror})") from None
    if len(data) != entry["bytes"]:
        raise CheckpointError(f"checkpoint file {path} is truncated ({len(data)} of {entry['bytes']} bytes)")
    if hashlib.sha256(data).hexdigest() != entry["sha256"]:
        raise CheckpointError(f"checkpoint file {path} is corrupted (sha256 mismatch)")
    return data


# ---- writing ----


def _save_tensors(path: Path, tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
    from safetensors.torch import save

    data = save({k: v.detach().contiguous().cpu() for k, v in tensors.items()})
    write_atomic(path, data)
    return {"name": path.name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


class Checkpointer:
    """Writes the snapshots of one run; never touches a file the last good manifest names."""

    def __init__(self, run_dir: Path, *, fingerprints: dict[str, str | None]) -> None:
        self.folder = run_dir / FOLDER
        self.fingerprints = fingerprints
        self.manifest = read_manifest(run_dir)

    @property
    def saved_length(self) -> int:
        """Full-cache positions covered by the saved KV segments (up to the last one's end)."""
        kv = [e for e in (self.manifest or {}).get("files", []) if e["kind"] == "kv"]
        return max((e["end"] for e in kv), default=0)

    def save(self, state: GenerationState, *, stream: StreamState, text_bytes: int) -> None:
        """Snapshot `state`; on any failure the previous snapshot stays the valid one."""
        import torch

        self.folder.mkdir(exist_ok=True)
        seq = (self.manifest or {}).get("seq", 0) + 1
        old = (self.manifest or {}).get("files", [])
        files = [e for e in old if e["kind"] == "kv" and not _never_read_again(e, state)]
        written: list[Path] = []
        try:
            # Positions a context window dropped before they were saved are never needed again.
            # At most SEGMENT positions per file: serialising copies a file's tensors twice in memory.
            pieces = [
                (piece, min(piece + SEGMENT, end))
                for held_start, end in state.full.held()
                for piece in range(max(held_start, self.saved_length), end, SEGMENT)
            ]
            for part, (start, end) in enumerate(pieces):
                path = self.folder / (f"kv-{seq:06d}.safetensors" if part == 0 else f"kv-{seq:06d}-{part}.safetensors")
                tensors = {}
                for i in range(len(state.full.layer_list)):
                    keys, values = state.full.segment(i, start, end)
                    tensors[f"keys.{i}"], tensors[f"values.{i}"] = keys[0], values[0]
                written.append(path)
                files.append({**_save_tensors(path, tensors), "kind": "kv", "start": start, "end": end})
            tensors = {
                "tokens": torch.tensor(state.tokens, dtype=torch.long),
                "stream": torch.tensor(stream.window, dtype=torch.long),
            }
            partial = state.partial
            selected = partial is not None and bool(partial.selected)
            if selected:
                assert partial is not None
                tensors |= {f"selected.{i}": s for i, s in enumerate(partial.selected)}
            path = self.folder / f"state-{seq:06d}.safetensors"
            written.append(path)
            files.append({**_save_tensors(path, tensors), "kind": "state"})
            body = {
                "schema": SCHEMA,
                "seq": seq,
                "written_at": datetime.now(UTC).isoformat(timespec="seconds"),
                **{f"{k}_fingerprint": v for k, v in self.fingerprints.items()},
                "kv": _kv_shape(state),
                "state": {
                    "prefix_length": state.prefix_length,
                    "tokens": len(state.tokens),
                    "root": state.root,
                    "eos_seen": state.eos_seen,
                    "emitted": state.stats.generated,
                    "text_bytes": text_bytes,
                    "stream_done": stream.done,
                    "window_start": partial.window_start if selected and partial is not None else None,
                    "ngram_indexed_until": state.ngrams.indexed_until,
                    "stats": state.stats.to_dict(),
                },
                "files": files,
            }
            write_json_atomic(self.folder / MANIFEST, {**body, "checksum": _digest(body)})
        except BaseException as error:
            if _saved_seq(self.folder) == seq:  # interrupted after the manifest's rename: it is the valid one
                self.manifest = read_manifest(self.folder.parent)
                raise
            for path in written:
                path.unlink(missing_ok=True)
            if isinstance(error, OSError):
                kept = f"the previous checkpoint ({self.manifest['state']['emitted']} tokens)" if self.manifest else ""
                reason = error.strerror or str(error)
                raise CheckpointError(
                    f"cannot write a checkpoint in {self.folder}: {reason}" + (f"; {kept} stays valid" if kept else "")
                ) from error
            raise
        self.manifest = {**body, "checksum": _digest(body)}
        self._remove_unreferenced()

    def _remove_unreferenced(self) -> None:
        """Old state files and leftovers of an interrupted write; never a file the manifest names."""
        keep = {e["name"] for e in (self.manifest or {}).get("files", [])} | {MANIFEST}
        for path in self.folder.iterdir():
            if path.name not in keep:
                with contextlib.suppress(OSError):
                    path.unlink()


def _saved_seq(folder: Path) -> int | None:
    """The sequence number of the manifest on disk (None: none, or unreadable)."""
    try:
        return cast(int | None, (read_manifest(folder.parent) or {}).get("seq"))
    except CheckpointError:
        return None


def _never_read_again(entry: dict[str, Any], state: GenerationState) -> bool:
    """Whether a saved KV segment lies out of the context window for good (and holds no sink).

    A resume loads only the sinks and the positions the next token sees (see `restore`), so such
    a segment can go: a 100K-token run would otherwise keep ~4.4 GB of keys/values on disk.
    """
    window = state.full.window
    if window is None:
        return False
    needed_from = len(state.tokens) - window.size + 1
    return entry["start"] >= window.sinks and entry["end"] <= needed_from


def _kv_shape(state: GenerationState) -> dict[str, Any]:
    from tokenswift_cli.model import kv_rows

    layer = state.full.layer_list[0]
    keys = layer.keys
    if keys is None:
        return {"layers": len(state.full.layer_list), "length": state.full.length}
    return {
        "layers": len(state.full.layer_list),
        "kv_heads": keys.shape[1],
        "head_dim": kv_rows.value_width(keys.shape[-1]) if layer.packed else keys.shape[-1],
        "dtype": str(layer.dtype or keys.dtype).removeprefix("torch."),  # int8: packed rows (kv_rows.py)
        "length": state.full.length,
    }


# ---- restoring ----


@dataclass
class Restored:
    state: GenerationState
    stream: StreamState
    text_bytes: int


def restore(
    run_dir: Path,
    manifest: dict[str, Any],
    *,
    cfg: RunConfig,
    num_layers: int,
    device: torch.device,
    dtype: torch.dtype,
    kv_dtype: torch.dtype | None = None,
    layer_devices: Sequence[torch.device] | None = None,
) -> Restored:
    """Rebuild the generation state of `manifest` (files verified again as they are read).

    The full cache gets the capacity an uninterrupted run with `cfg` would have had, so that the
    resumed run computes on identically laid-out buffers. `layer_devices`: where each layer's keys and
    values go (`--device auto` spreads the layers), default `device` for all.
    """
    from safetensors.torch import load

    from tokenswift_cli.engine.metrics import Stats
    from tokenswift_cli.engine.ngram import NGramTable
    from tokenswift_cli.engine.state import TREE_HEADROOM, GenerationState, full_capacity, uses_partial_cache
    from tokenswift_cli.model.cache import FullCache, PartialCache

    folder, info = run_dir / FOLDER, manifest["state"]
    kv_dtype = kv_dtype or dtype  # the full cache's storage (`state.kv_storage`)
    devices = list(layer_devices) if layer_devices is not None else [device] * num_layers
    kv = manifest["kv"]
    if kv["layers"] != num_layers:
        raise CheckpointError(f"the checkpoint has {kv['layers']} layers, the model {num_layers}")
    stores = str(kv_dtype).removeprefix("torch.")
    if kv.get("dtype", stores) != stores:
        raise CheckpointError(f"the checkpoint holds {kv['dtype']} keys/values, the run stores {stores}")
    entries = sorted((e for e in manifest["files"] if e["kind"] == "kv"), key=lambda e: e["start"])
    state_entry = next(e for e in manifest["files"] if e["kind"] == "state")
    saved = load(_read_verified(folder, state_entry))
    tokens = saved["tokens"].tolist()
    prefix_length = info["prefix_length"]
    window = cfg.context_window
    capacity = max(full_capacity(cfg, prefix_length), len(tokens) + TREE_HEADROOM if window is None else 0)
    full = FullCache(num_layers, capacity=capacity, window=window, dtype=kv_dtype)
    # With a context window only the sinks and the positions the next token sees are loaded.
    needed_from = len(tokens) - window.size + 1 if window is not None else 0
    for entry in entries:
        if window is not None and full.length >= window.sinks and entry["end"] <= needed_from:
            continue
        if entry["start"] > full.length and window is not None and window.sinks <= full.length:
            full.skip_to(entry["start"])
        if entry["start"] != full.length:
            raise CheckpointError(f"the KV segments of {run_dir.name} are not contiguous at {entry['name']}")
        tensors = load(_read_verified(folder, entry))
        for i in range(num_layers):
            where = devices[i]
            full.load_segment(i, tensors[f"keys.{i}"][None].to(where), tensors[f"values.{i}"][None].to(where))
        full.evict()
    if window is not None and full.first_recent > max(needed_from, window.sinks):
        raise CheckpointError(f"the checkpoint of {run_dir.name} lacks keys/values its context window needs")
    if full.length != len(tokens) or len(tokens) != info["tokens"]:
        raise CheckpointError(
            f"the checkpoint of {run_dir.name} is inconsistent ({full.length} cached, {len(tokens)} tokens)"
        )
    partial, draft = None, cfg.draft
    if uses_partial_cache(cfg):
        assert draft.partial_budget is not None
        partial = PartialCache(
            num_layers, budget=draft.partial_budget, sinks=draft.sink_tokens, window=draft.recent_window, dtype=dtype
        )
        if info["window_start"] is not None:
            selections = [saved[f"selected.{i}"].to(devices[i]) for i in range(num_layers)]
            partial.restore(full, selections, info["window_start"])
    ngrams = NGramTable(cfg.draft.ngram_size)
    lag = cfg.sampling.penalty_window if cfg.sampling.penalty is not None else 0
    ngrams.update(tokens, until=len(tokens) - lag)
    if ngrams.indexed_until != info["ngram_indexed_until"]:
        raise CheckpointError(f"the n-gram table of {run_dir.name} does not rebuild to the saved one")
    stats = Stats.from_dict(info["stats"])
    state = GenerationState(tokens, prefix_length, info["root"], full, partial, ngrams, stats, info["eos_seen"])
    stream = StreamState(tuple(saved["stream"].tolist()), info["stream_done"])
    return Restored(state, stream, info["text_bytes"])
