"""Checkpoints: restore-then-continue equals uninterrupted; append-only segments; damaged files refused;
a failed write (full disk) leaves the previous checkpoint valid; the lock."""

from __future__ import annotations

import errno
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from cli_helpers import one_thread
from helpers import random_heads, random_prompt, tiny_target

from tokenswift_cli.config import DraftConfig, RunConfig, SamplingConfig
from tokenswift_cli.engine.decode import generate
from tokenswift_cli.engine.state import GenerationState, prefill
from tokenswift_cli.runs import checkpoint
from tokenswift_cli.runs.checkpoint import Checkpointer, CheckpointError, read_manifest, restore
from tokenswift_cli.runs.durable import RunLock, is_locked
from tokenswift_cli.runs.textstream import StreamState

CFG = RunConfig(
    max_new_tokens=160,
    sampling=SamplingConfig(temperature=1.0, min_p=0.05, penalty=1.2, penalty_window=32, seed=5),
    draft=DraftConfig(partial_budget=64, sink_tokens=4, recent_window=16),
)
STREAM = StreamState((1, 2, 3), 7)


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    with one_thread():
        yield


@pytest.fixture(scope="module")
def engine():  # type: ignore[no-untyped-def]
    target = tiny_target("llama-gqa", seed=3)
    return target, random_heads(target)


def run_until(engine, generated: int, state: GenerationState | None = None) -> GenerationState:  # type: ignore[no-untyped-def]
    target, heads = engine
    state = state or prefill(target, random_prompt(90, seed=4), CFG)
    if state.stats.generated < generated:
        for _ in generate(target, heads, state, CFG):
            if state.stats.generated >= generated:
                break
    return state


def restored(engine, folder: Path, dtype: torch.dtype = torch.float32) -> checkpoint.Restored:  # type: ignore[no-untyped-def]
    target, _ = engine
    manifest = read_manifest(folder)
    assert manifest is not None
    return restore(folder, manifest, cfg=CFG, num_layers=target.num_layers, device=target.device, dtype=dtype)


def save(folder: Path, state: GenerationState) -> Checkpointer:
    saver = Checkpointer(folder, fingerprints={"model": "m" * 64, "heads": None})
    saver.save(state, stream=STREAM, text_bytes=0)
    return saver


@pytest.mark.parametrize("segment", [512, 16])
def test_restore_then_continue_equals_uninterrupted(
    engine, tmp_path: Path, segment: int, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(checkpoint, "SEGMENT", segment)  # 16: the cache goes to disk in several files
    reference = run_until(engine, CFG.max_new_tokens)
    state = run_until(engine, 70)
    assert state.partial is not None and state.partial.selected  # the partial cache is in use
    save(tmp_path, state)
    kv = sorted(p.name for p in (tmp_path / "checkpoint").glob("kv-*"))
    assert len(kv) == (1 if segment == 512 else -(-state.full.length // segment)), kv
    back = restored(engine, tmp_path)
    new = back.state
    assert back.stream == STREAM
    assert (new.tokens, new.root, new.prefix_length, new.eos_seen) == (
        state.tokens,
        state.root,
        state.prefix_length,
        False,
    )
    assert new.ngrams.counts == state.ngrams.counts  # rebuilt from the tokens
    assert new.stats.to_dict() == state.stats.to_dict()
    assert new.partial is not None and new.partial.window_start == state.partial.window_start
    for a, b in zip(new.partial.layer_list, state.partial.layer_list, strict=True):
        assert torch.equal(a.committed()[0], b.committed()[0]) and torch.equal(a.committed()[1], b.committed()[1])
    run_until(engine, CFG.max_new_tokens, new)
    end = new.prefix_length + CFG.max_new_tokens
    assert new.tokens[:end] == reference.tokens[:end]


def test_a_float16_cache_restores_and_continues_as_uninterrupted(engine, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    target, heads = engine
    cfg = CFG.replace(kv_cache="float16")

    def run(state: GenerationState, generated: int) -> GenerationState:
        for _ in generate(target, heads, state, cfg):
            if state.stats.generated >= generated:
                break
        return state

    prompt = random_prompt(90, seed=4)
    reference = run(prefill(target, prompt, cfg), cfg.max_new_tokens)
    state = run(prefill(target, prompt, cfg), 70)
    assert state.full.layer_list[0].keys.dtype == torch.float16 and state.partial is not None
    save(tmp_path, state)
    manifest = read_manifest(tmp_path)
    assert manifest is not None and manifest["kv"]["dtype"] == "float16"
    with pytest.raises(CheckpointError, match="holds float16 keys/values, the run stores float32"):
        restore(tmp_path, manifest, cfg=cfg, num_layers=target.num_layers, device=target.device, dtype=torch.float32)
    back = restore(tmp_path, manifest, cfg=cfg, num_layers=target.num_layers, device=target.device,
                   dtype=torch.float32, kv_dtype=torch.float16).state  # fmt: skip
    assert torch.equal(back.full.layer_list[-1].committed()[0], state.full.layer_list[-1].committed()[0])
    run(back, cfg.max_new_tokens)
    end = back.prefix_length + cfg.max_new_tokens
    assert back.tokens[:end] == reference.tokens[:end]


def test_segments_are_append_only(engine, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    state = run_until(engine, 20)
    saver = save(tmp_path, state)
    folder = tmp_path / "checkpoint"
    first = (folder / "kv-000001.safetensors").read_bytes()
    length = state.full.length
    run_until(engine, 50, state)
    saver.save(state, stream=STREAM, text_bytes=0)
    manifest = read_manifest(tmp_path)
    assert manifest is not None and manifest["seq"] == 2
    segments = [(e["name"], e["start"], e["end"]) for e in manifest["files"] if e["kind"] == "kv"]
    assert segments == [("kv-000001.safetensors", 0, length), ("kv-000002.safetensors", length, state.full.length)]
    assert (folder / "kv-000001.safetensors").read_bytes() == first
    assert sorted(p.name for p in folder.iterdir()) == [
        "kv-000001.safetensors", "kv-000002.safetensors", "manifest.json", "state-000002.safetensors"
    ]  # fmt: skip
    saver.save(state, stream=STREAM, text_bytes=0)  # nothing new in the cache: no new segment
    assert not (folder / "kv-000003.safetensors").exists()


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete"])
def test_damaged_segment_is_refused(engine, tmp_path: Path, damage: str) -> None:  # type: ignore[no-untyped-def]
    save(tmp_path, run_until(engine, 10))
    segment = tmp_path / "checkpoint" / "kv-000001.safetensors"
    data = bytearray(segment.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 1
        segment.write_bytes(bytes(data))
    elif damage == "truncate":
        segment.write_bytes(bytes(data[:-100]))
    else:
        segment.unlink()
    expected = {"flip": "corrupted", "truncate": "truncated", "delete": "cannot be read"}[damage]
    with pytest.raises(CheckpointError, match=expected):
        restored(engine, tmp_path)


def test_damaged_manifest_is_refused(engine, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    save(tmp_path, run_until(engine, 10))
    path = tmp_path / "checkpoint" / "manifest.json"
    data = json.loads(path.read_text())
    data["state"]["root"] += 1  # valid JSON, wrong content
    path.write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match="manifest .* corrupted"):
        read_manifest(tmp_path)
    path.write_text(path.read_text()[:50])
    with pytest.raises(CheckpointError, match="corrupted"):
        read_manifest(tmp_path)


def test_full_disk_keeps_the_previous_checkpoint(engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    state = run_until(engine, 20)
    saver = save(tmp_path, state)
    before = sorted(p.name for p in (tmp_path / "checkpoint").iterdir())
    run_until(engine, 40, state)
    real = checkpoint.write_atomic

    def full_disk(path: Path, data: bytes) -> None:
        if path.name.startswith("state-"):  # the KV segment went through, then the disk filled up
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        real(path, data)

    monkeypatch.setattr(checkpoint, "write_atomic", full_disk)
    with pytest.raises(CheckpointError, match="No space left on device.*previous checkpoint"):
        saver.save(state, stream=STREAM, text_bytes=0)
    assert sorted(p.name for p in (tmp_path / "checkpoint").iterdir()) == before
    manifest = read_manifest(tmp_path)
    assert manifest is not None and manifest["seq"] == 1
    assert restored(engine, tmp_path).state.stats.generated == manifest["state"]["emitted"] < state.stats.generated
    monkeypatch.setattr(checkpoint, "write_atomic", real)
    saver.save(state, stream=STREAM, text_bytes=0)  # the disk has room again
    assert restored(engine, tmp_path).state.tokens == state.tokens


def test_leftovers_of_a_crash_are_ignored_then_removed(engine, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    state = run_until(engine, 10)
    saver = save(tmp_path, state)
    folder = tmp_path / "checkpoint"
    (folder / "kv-000002.safetensors").write_bytes(b"half a segment")  # killed while writing
    (folder / ".manifest.json.tmp").write_bytes(b"{")
    assert restored(engine, tmp_path).state.tokens == state.tokens
    run_until(engine, 30, state)
    saver.save(state, stream=STREAM, text_bytes=0)
    assert not (folder / ".manifest.json.tmp").exists()
    assert restored(engine, tmp_path).state.tokens == state.tokens


def test_other_dtype_is_refused(engine, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    save(tmp_path, run_until(engine, 5))
    with pytest.raises(CheckpointError, match="float32"):
        restored(engine, tmp_path, dtype=torch.bfloat16)


def test_lock(tmp_path: Path) -> None:
    assert not is_locked(tmp_path)
    with RunLock(tmp_path):
        assert is_locked(tmp_path)
        with pytest.raises(CheckpointError, match=r"another process \(pid \d+\)"), RunLock(tmp_path):
            pass
    assert not is_locked(tmp_path)
    with RunLock(tmp_path):  # released: can be taken again
        pass
