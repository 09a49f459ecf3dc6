"""Model loading: tiny random models saved to tmp_path (fast), and the embedded default model (slow).

A folder without tokenizer files loads with `tokenizer=None`; the default model always has one.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
)
from transformers.utils import logging as hf_logging

from tokenswift_cli.config import ModelSpec
from tokenswift_cli.model import loading
from tokenswift_cli.model.loading import (
    LoadedModel,
    ModelLoadError,
    default_model_path,
    describe,
    folder_fingerprint,
    load_model,
    supported_model_types,
)
from tokenswift_cli.paths import cache_dir, home_dir

TINY = {
    "vocab_size": 128,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
}


def tiny_llama(folder: Path, seed: int = 0, **overrides: int) -> Path:
    """Save a 2-layer random llama (GQA: 4 query heads, 2 KV heads) into `folder`."""
    torch.manual_seed(seed)
    LlamaForCausalLM(LlamaConfig(**{**TINY, **overrides})).save_pretrained(folder)
    return folder


def load(name: str | Path, **spec: str) -> LoadedModel:
    return load_model(ModelSpec(name=str(name), **spec))


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Keep every test out of the user's real cache."""
    monkeypatch.setenv("TOKENSWIFT_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


# ---------------------------------------------------------------- paths


def test_paths_honour_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOKENSWIFT_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TOKENSWIFT_CACHE", str(tmp_path / "c"))
    assert home_dir() == tmp_path / "home" and cache_dir() == tmp_path / "c"
    assert not (tmp_path / "home").exists() and not (tmp_path / "c").exists()  # created lazily


def test_paths_default_to_xdg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("TOKENSWIFT_HOME", "TOKENSWIFT_CACHE"):
        monkeypatch.setenv(name, "")  # empty counts as unset
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert home_dir() == tmp_path / "data" / "tokenswift"
    assert cache_dir() == tmp_path / "cache" / "tokenswift"
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert home_dir() == tmp_path / ".local" / "share" / "tokenswift"
    assert cache_dir() == tmp_path / ".cache" / "tokenswift"


# ---------------------------------------------------------------- local folders


def test_local_folder_loads_ready_for_inference(tmp_path: Path) -> None:
    loaded = load(tiny_llama(tmp_path / "m"))
    assert loaded.name == str(tmp_path / "m") and loaded.source == str(tmp_path / "m")
    assert loaded.tokenizer is None  # the folder has no tokenizer files
    assert not loaded.model.training
    assert not any(p.requires_grad for p in loaded.model.parameters())
    assert loaded.model.dtype == torch.float32  # "auto" on CPU
    logits = loaded.model(torch.tensor([[1, 2, 3]])).logits
    assert logits.shape == (1, 3, 128)
    info = describe(loaded)
    assert info["type"] == "llama" and info["layers"] == 2 and info["hidden_size"] == 64
    assert (info["heads"], info["kv_heads"], info["vocab_size"]) == (4, 2, 128)
    assert info["dtype"] == "float32" and info["device"] == "cpu"
    assert info["max_position_embeddings"] == 256
    assert info["parameters"] == sum(p.numel() for p in loaded.model.parameters())


@pytest.mark.parametrize("family", ["qwen2", "mistral"])
def test_other_supported_families_load(tmp_path: Path, family: str) -> None:
    config = AutoConfig.for_model(family, **TINY)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / family)
    assert describe(load(tmp_path / family))["type"] == family


def test_fingerprint_is_stable_and_tells_models_apart(tmp_path: Path) -> None:
    a = tiny_llama(tmp_path / "a", seed=0)
    b = tiny_llama(tmp_path / "b", seed=1)
    same_as_a = tiny_llama(tmp_path / "a2", seed=0)
    first, again = load(a).fingerprint, load(a).fingerprint
    assert first == again == folder_fingerprint(a)
    assert len(first) == 64 and int(first, 16) >= 0
    assert load(b).fingerprint != first
    # The same weights saved elsewhere are the same model (the path is not part of the fingerprint).
    assert load(same_as_a).fingerprint == first


def test_fingerprint_sees_one_retrained_tensor(tmp_path: Path) -> None:
    # Every tensor is sampled, so a fine-tune that touched a single matrix still shows.
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**TINY))
    model.save_pretrained(tmp_path / "a")
    with torch.no_grad():
        model.model.layers[1].mlp.down_proj.weight.mul_(1.001)
    model.save_pretrained(tmp_path / "b")
    assert folder_fingerprint(tmp_path / "a") != folder_fingerprint(tmp_path / "b")


def test_fingerprint_does_not_depend_on_config_writer(tmp_path: Path) -> None:
    folder = tiny_llama(tmp_path / "m")
    before = folder_fingerprint(folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(_name_or_path="somewhere/else", transformers_version="0.0.1")  # who wrote it, not what
    (folder / "config.json").write_text(json.dumps(config, indent=4))
    assert folder_fingerprint(folder) == before


def test_dtype_is_honoured_and_fingerprint_ignores_it(tmp_path: Path) -> None:
    folder = tiny_llama(tmp_path / "m")
    bf16 = load(folder, dtype="bfloat16")
    assert bf16.model.dtype == torch.bfloat16
    assert all(p.dtype == torch.bfloat16 for p in bf16.model.parameters())
    assert describe(bf16)["dtype"] == "bfloat16"
    assert load(folder, dtype="float16").model.dtype == torch.float16
    assert bf16.fingerprint == load(folder, dtype="float32").fingerprint


def test_attn_implementation_is_passed_through(tmp_path: Path) -> None:
    loaded = load_model(ModelSpec(name=str(tiny_llama(tmp_path / "m"))), attn_implementation="eager")
    assert loaded.model.config._attn_implementation == "eager"


def test_tokenizer_is_loaded_when_present(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    folder = tiny_llama(tmp_path / "m")
    backend = Tokenizer(models.WordLevel({"<unk>": 0, "hello": 1, "world": 2}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>").save_pretrained(folder)
    loaded = load(folder)
    assert loaded.tokenizer is not None
    assert loaded.tokenizer("hello world")["input_ids"] == [1, 2]


def test_loading_restores_transformers_logging(tmp_path: Path) -> None:
    before = (hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled())
    load(tiny_llama(tmp_path / "m"))
    assert (hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()) == before


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize("name", ["./no-such-folder", "/no/such/model.gguf", "~/no-such.gguf"])
def test_missing_path_is_a_clear_error(name: str) -> None:
    with pytest.raises(ModelLoadError, match="no such model file or folder"):
        load(name)


def test_unknown_hub_id_is_a_clear_error() -> None:
    # No network here; with network the hub answers 404. Either way: not found, could not download.
    with pytest.raises(ModelLoadError, match="not found locally and could not be downloaded"):
        load("tokenswift-no-such-org/no-such-model-xyz")


def test_folder_without_config_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match="no config.json"):
        load(tmp_path / "empty")


def test_folder_without_weights_is_a_clear_error(tmp_path: Path) -> None:
    folder = tiny_llama(tmp_path / "m")
    (folder / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match="cannot load the model"):
        load(folder)


def test_weights_that_do_not_match_the_config_are_refused(tmp_path: Path) -> None:
    folder = tiny_llama(tmp_path / "m")
    tiny_llama(tmp_path / "deeper", num_hidden_layers=3)
    (folder / "config.json").write_text((tmp_path / "deeper" / "config.json").read_text())
    with pytest.raises(ModelLoadError, match="do not match its config"):
        load(folder)


def test_unsupported_architecture_is_refused(tmp_path: Path) -> None:
    torch.manual_seed(0)
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=128, n_embd=32, n_layer=1, n_head=2))
    gpt2.save_pretrained(tmp_path / "g")
    with pytest.raises(ModelLoadError, match="gpt2 is not supported; supported: llama, qwen2, mistral"):
        load(tmp_path / "g")
    assert supported_model_types == ("llama", "qwen2", "mistral")


def test_file_that_is_not_gguf_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "model.gguf").write_text("this is not a GGUF file")
    with pytest.raises(ModelLoadError, match="neither a valid GGUF file"):
        load(tmp_path / "model.gguf")


def test_truncated_gguf_is_a_clear_error(tmp_path: Path, private_cache: Path) -> None:
    broken = tmp_path / "broken.gguf"
    with default_model_path().open("rb") as f:
        broken.write_bytes(f.read(1 << 20))  # valid header, tensors cut off
    with pytest.raises(ModelLoadError, match="damaged or unsupported GGUF"):
        load(broken)
    assert list((private_cache / "models").iterdir()) == []  # the temporary folder is gone


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_cuda_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="not available"):
        load(tiny_llama(tmp_path / "m"), device="cuda:0")


# ---------------------------------------------------------------- the embedded default model


def test_default_model_path_finds_the_embedded_gguf() -> None:
    path = default_model_path()
    assert path.suffix == ".gguf" and path.stat().st_size > 50_000_000
    assert path.read_bytes()[:4] == b"GGUF"


@pytest.fixture(scope="session")
def default_loads(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    """Load the default model twice into a fresh cache; keep the in-memory GGUF conversion for checks."""
    cache = tmp_path_factory.mktemp("default-cache")
    converted: list[torch.nn.Module] = []
    convert = loading._convert_gguf

    def spy(gguf: Path, dest: Path) -> torch.nn.Module:
        converted.append(convert(gguf, dest))
        return converted[-1]

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TOKENSWIFT_CACHE", str(cache))
        mp.setattr(loading, "_convert_gguf", spy)
        first = load_model(ModelSpec(weights="dense"))
        second = load_model(ModelSpec(weights="dense"))
    return SimpleNamespace(first=first, second=second, converted=converted, cache=cache)


@pytest.mark.slow
def test_default_model_is_converted_once_then_cached(default_loads: SimpleNamespace) -> None:
    first, second = default_loads.first, default_loads.second
    assert len(default_loads.converted) == 1  # the second load read the cached copy
    folder = Path(first.source)
    assert folder.parent == default_loads.cache / "models" and folder.name.startswith("SmolLM2-135M-Instruct")
    assert second.source == first.source and (folder / "model.safetensors").is_file()
    assert [p.name for p in folder.parent.iterdir()] == [folder.name]  # no temporary folder left
    assert second.fingerprint == first.fingerprint
    info = describe(second)
    assert info["name"] == "default" and info["type"] == "llama"
    assert (info["layers"], info["hidden_size"], info["heads"], info["kv_heads"]) == (30, 576, 9, 3)
    assert info["vocab_size"] == 49152 and 130e6 < info["parameters"] < 140e6
    tokenizer = second.tokenizer
    assert tokenizer is not None
    text = "The lighthouse keeper wrote: «Storm tonight.»"
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text


@pytest.mark.slow
def test_cached_copy_gives_the_same_logits_as_the_gguf_conversion(default_loads: SimpleNamespace) -> None:
    [converted] = default_loads.converted
    tokenizer = default_loads.first.tokenizer
    ids = tokenizer("The lighthouse keeper climbed the stairs and", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        expected = converted(ids).logits
        for loaded in (default_loads.first, default_loads.second):
            assert torch.equal(loaded.model(ids).logits, expected)


@pytest.mark.slow
def test_fingerprint_of_the_default_model_reads_samples_not_the_weights(
    default_loads: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cheap whatever the machine's load: it reads a header and a few bytes per tensor, not ~500 MB."""
    folder = Path(default_loads.first.source)
    read: dict[str, int] = {}
    real_open = Path.open

    def counting_open(path: Path, *args: object, **kwargs: object):  # type: ignore[no-untyped-def]
        handle = real_open(path, *args, **kwargs)  # type: ignore[arg-type]
        real_read = handle.read

        def counted(*a: object) -> object:
            data = real_read(*a)
            read[path.name] = read.get(path.name, 0) + len(data)
            return data

        handle.read = counted  # type: ignore[method-assign]
        return handle

    monkeypatch.setattr(Path, "open", counting_open)
    assert folder_fingerprint(folder) == default_loads.first.fingerprint
    monkeypatch.undo()
    weights = (folder / "model.safetensors").stat().st_size
    assert 0 < read.get("model.safetensors", 0) < weights // 100, (read, weights)
