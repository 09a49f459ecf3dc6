from __future__ import annotations

from pathlib import Path

import pytest
from helpers import random_heads, tiny_target

from tokenswift_cli.model.heads import HeadsError, load_heads, save_heads


def test_heads_round_trip_and_refusals(tmp_path: Path) -> None:
    target = tiny_target("llama-gqa")
    heads = random_heads(target)
    path = tmp_path / "h.safetensors"
    save_heads(heads, path, {"base_model_fingerprint": "abc"})
    loaded = load_heads(path, target.model.config, fingerprint="abc")
    for (k, a), (_, b) in zip(heads.state_dict().items(), loaded.state_dict().items(), strict=True):
        assert (a == b).all(), k
    with pytest.raises(HeadsError, match="another model"):
        load_heads(path, target.model.config, fingerprint="xyz")
    with pytest.raises(HeadsError, match="not found"):
        load_heads(tmp_path / "missing.safetensors", target.model.config)
    (tmp_path / "bad.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(HeadsError, match="cannot read"):
        load_heads(tmp_path / "bad.safetensors", target.model.config)
