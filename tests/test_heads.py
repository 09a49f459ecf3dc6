"""Draft heads: import from a TokenSwift model checkpoint, identity checks, shipped heads, CLI."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import typer
from helpers import random_heads, tiny_target
from safetensors.torch import save_file
from typer.testing import CliRunner

from tokenswift_cli.cli import heads as cli_heads
from tokenswift_cli.cli import train_heads as cli_train_heads
from tokenswift_cli.data import HEADS
from tokenswift_cli.model.heads import (
    HeadsError,
    import_heads,
    load_heads,
    model_identity,
    read_metadata,
    resolve_heads,
    save_heads,
    shipped_heads,
)

REPO = Path(__file__).resolve().parents[1]


def _tokenswift_checkpoint(folder: Path, fmt: str = "safetensors") -> dict[str, torch.Tensor]:
    """A TokenSwift-style model checkpoint: the base weights with the heads under `model.medusa_layers.*`,
    split over two shards as large checkpoints are."""
    target = tiny_target("llama-gqa")
    heads = random_heads(target, num_heads=4, seed=3)
    base = {k: v.clone() for k, v in target.model.state_dict().items()}
    medusa = {f"model.{k}": v.clone() for k, v in heads.state_dict().items()}
    folder.mkdir(parents=True)
    first = dict(list(base.items())[: len(base) // 2])
    second = dict(list(base.items())[len(base) // 2 :]) | medusa
    if fmt == "safetensors":
        save_file(first, str(folder / "model-00001-of-00002.safetensors"))
        save_file(second, str(folder / "model-00002-of-00002.safetensors"))
    else:
        torch.save(first, folder / "pytorch_model-00001-of-00002.bin")
        torch.save(second, folder / "pytorch_model-00002-of-00002.bin")
    (folder / "config.json").write_text(json.dumps({"hidden_size": 64, "rms_norm_eps": 1e-5}))
    return {k.removeprefix("model."): v for k, v in medusa.items()}


@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
def test_import_from_a_tokenswift_model_checkpoint(tmp_path: Path, fmt: str) -> None:
    expected = _tokenswift_checkpoint(tmp_path / "ckpt", fmt)
    target = tiny_target("llama-gqa")
    heads = import_heads(tmp_path / "ckpt", target.model.config)
    assert heads.num_heads == 4
    for key, value in heads.state_dict().items():
        assert torch.equal(value, expected[key]), key
    assert import_heads(tmp_path / "ckpt").hidden_size == 64  # sized from the tensors alone


def test_import_refuses_checkpoints_without_matching_heads(tmp_path: Path) -> None:
    _tokenswift_checkpoint(tmp_path / "ckpt")
    with pytest.raises(HeadsError, match="hidden size 64, the model has 128"):
        import_heads(tmp_path / "ckpt", SimpleNamespace(hidden_size=128, rms_norm_eps=1e-5))
    save_file({"model.norm.weight": torch.ones(4)}, str(tmp_path / "plain.safetensors"))
    with pytest.raises(HeadsError, match="no draft heads"):
        import_heads(tmp_path / "plain.safetensors")
    with pytest.raises(HeadsError, match="no such checkpoint"):
        import_heads(tmp_path / "missing")


def test_the_gguf_identity_wins_over_the_converted_copy_fingerprint(tmp_path: Path) -> None:
    target = tiny_target("llama-gqa")
    path = tmp_path / "h.safetensors"
    meta = {"base_model_fingerprint": "old-conversion", "base_model_gguf_sha256": "sha-of-gguf"}
    save_heads(random_heads(target), path, meta)
    load_heads(path, target.model.config, fingerprint="new-conversion", gguf_sha256="sha-of-gguf")
    with pytest.raises(HeadsError, match="another model"):
        load_heads(path, target.model.config, fingerprint="old-conversion", gguf_sha256="other-gguf")
    with pytest.raises(HeadsError, match="another model"):
        load_heads(path, target.model.config, fingerprint="new-conversion")


def test_model_identity_reads_the_conversion_record(tmp_path: Path) -> None:
    assert model_identity("fp") == {"base_model_fingerprint": "fp"}
    (tmp_path / "tokenswift-source.json").write_text(json.dumps({"gguf_sha256": "abc"}))
    assert model_identity("fp", str(tmp_path))["base_model_gguf_sha256"] == "abc"


def test_resolve_heads_choices(tmp_path: Path) -> None:
    target = tiny_target("llama-gqa")
    loaded = SimpleNamespace(model=target.model, name="some/folder", fingerprint="fp", source="")
    path = tmp_path / "h.safetensors"
    save_heads(random_heads(target), path, {"base_model_fingerprint": "fp"})
    assert resolve_heads("none", loaded) == (None, None)  # type: ignore[arg-type]
    assert resolve_heads("default", loaded) == (None, None)  # type: ignore[arg-type]  # none shipped for it
    heads, origin = resolve_heads(str(path), loaded)  # type: ignore[arg-type]
    assert heads is not None and origin == path


def test_shipped_heads_for_the_default_model() -> None:
    path = shipped_heads("default")
    assert path is not None and path.parent == HEADS
    meta = read_metadata(path)
    assert meta["hidden_size"] == "576" and meta["num_heads"] == "3" and meta["complete"] == "true"
    assert meta["base_model_gguf_sha256"] and meta["base_model_fingerprint"]
    accuracy = json.loads(meta["accuracy"])
    assert all(len(v["top1"]) == 3 for v in accuracy.values())
    heads = load_heads(path, SimpleNamespace(hidden_size=576, rms_norm_eps=1e-5))
    assert heads.num_heads == 3


def _app() -> typer.Typer:
    app = typer.Typer()
    app.command("noop")(lambda: None)  # a second command keeps the group names as typed
    cli_heads.register(app)
    cli_train_heads.register(app)
    return app


def test_cli_import_and_info(tmp_path: Path) -> None:
    _tokenswift_checkpoint(tmp_path / "ckpt")
    out = tmp_path / "imported.safetensors"
    result = CliRunner().invoke(_app(), ["heads", "import", str(tmp_path / "ckpt"), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "4 heads, hidden size 64" in result.output
    result = CliRunner().invoke(_app(), ["heads", "info", str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["imported_from"] == str(tmp_path / "ckpt")
    bad = CliRunner().invoke(_app(), ["heads", "import", str(tmp_path / "nothing"), "--out", str(out)])
    assert bad.exit_code != 0 and "no such checkpoint" in bad.output


def test_cli_help_lists_the_commands() -> None:
    result = CliRunner().invoke(_app(), ["--help"])
    assert "train-heads" in result.output and "heads" in result.output
    result = CliRunner().invoke(_app(), ["train-heads", "--help"])
    assert result.exit_code == 0 and "--target" in result.output
