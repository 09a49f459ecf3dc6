"""GGUF files on their own blocks (`--weights gguf`): every block type's product, the model it builds
(against transformers' de-quantised model), and TokenSwift equal to plain decoding on each type."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import quantize
from helpers import random_heads, random_prompt
from tiny_gguf import BLOCK_TYPES, random_blocks, write_tiny_gguf

from tokenswift_cli.backends.cpu import blocks, kernels
from tokenswift_cli.config import DraftConfig, ModelSpec, RunConfig, SamplingConfig
from tokenswift_cli.engine.decode import generate_tokens
from tokenswift_cli.model import memory
from tokenswift_cli.model.loading import LoadedModel, ModelLoadError, load_model
from tokenswift_cli.model.target import Target

pytestmark = pytest.mark.skipif(not kernels.available(), reason="no C++ kernels")


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TOKENSWIFT_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def block_rows(kind: str, rows: int, width: int, seed: int = 0) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    if kind.endswith("_K"):
        data = random_blocks(kind, rows, width, rng)
    else:
        data = quantize(rng.normal(0, 0.1, size=(rows, width)).astype(np.float32), GGMLQuantizationType[kind])
    return torch.from_numpy(np.ascontiguousarray(data))


@pytest.mark.parametrize("kind", BLOCK_TYPES)
def test_block_products_read_the_files_weights_exactly(kind: str) -> None:
    """With activations that 8 bits hold exactly (integers, each block's largest 127), the product is the
    de-quantised weights' to float32 rounding: every level, scale and minimum is read where ggml puts it."""
    width = 512
    rows = block_rows(kind, 37, width)
    qtype = GGMLQuantizationType[kind]
    elements = GGML_QUANT_SIZES[qtype][0]
    x = torch.randint(-127, 128, (5, width), generator=torch.Generator().manual_seed(1)).float()
    x.view(5, -1, elements)[:, :, 0] = 127
    y = kernels.load().block_products(x, rows, int(qtype), None)
    reference = x.double() @ blocks.dequantized(rows, qtype).double().T
    assert ((y.double() - reference).abs().max() / reference.abs().max()).item() < 1e-6


@pytest.mark.parametrize("kind", BLOCK_TYPES)
def test_a_rows_product_does_not_depend_on_the_others(kind: str) -> None:
    rows = block_rows(kind, 67, 768, seed=2)
    qtype = GGMLQuantizationType[kind]
    x = torch.randn(11, 768, generator=torch.Generator().manual_seed(3)) * 2
    bias = torch.randn(67)
    together = kernels.load().block_products(x, rows, int(qtype), bias)
    alone = torch.cat([kernels.load().block_products(x[i : i + 1], rows, int(qtype), bias) for i in range(11)])
    assert torch.equal(together, alone)
    reference = x.double() @ blocks.dequantized(rows, qtype).double().T + bias.double()
    assert ((together.double() - reference).norm() / reference.norm()).item() < 2e-2  # 8-bit activations


def load(path: Path, weights: str = "gguf") -> LoadedModel:
    return load_model(ModelSpec(name=str(path), weights=weights))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("arch", "kind"), [("qwen2", kind) for kind in BLOCK_TYPES] + [("llama", k) for k in ("Q4_K", "Q6_K", "Q5_0")]
)
def test_a_tiny_gguf_computes_what_transformers_computes_from_it(tmp_path: Path, arch: str, kind: str) -> None:
    """transformers de-quantises the file (and un-permutes llama's q/k); the blocks read in place give its
    logits to the 8-bit activations' error."""
    from transformers import AutoModelForCausalLM

    path = write_tiny_gguf(tmp_path / f"{arch}-{kind}.gguf", kind, arch)
    loaded = load(path)
    reference = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=path.name, dtype=torch.float32).eval()
    ids = torch.randint(0, 96, (1, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours, theirs = loaded.model(ids).logits, reference(ids).logits
    assert ((ours - theirs).norm() / theirs.norm()).item() < 3e-2
    assert (ours.argmax(-1) == theirs.argmax(-1)).float().mean().item() >= 0.8


@pytest.mark.parametrize("kind", BLOCK_TYPES)
def test_tokenswift_writes_plain_decodings_tokens_on_every_block_type(tmp_path: Path, kind: str) -> None:
    loaded = load(write_tiny_gguf(tmp_path / f"{kind}.gguf", kind))
    target = Target(loaded.model)
    assert target.backend.native is not None  # every layer in the C++ decoder, on the block products
    heads, prompt = random_heads(target), random_prompt(40)
    for sampling in (SamplingConfig(), SamplingConfig(temperature=1.0, min_p=0.05, seed=5)):
        config = RunConfig(max_new_tokens=48, sampling=sampling, prefill_chunk=16)
        plain, _ = generate_tokens(target, None, prompt, config.replace(mode="plain"))
        fast, _ = generate_tokens(target, heads, prompt, config.replace(draft=DraftConfig(tree=(1, 3, 3))))
        assert fast == plain, (kind, sampling.temperature)


def test_auto_reads_a_gguf_in_place_without_a_converted_copy(tmp_path: Path, private_cache: Path) -> None:
    path = write_tiny_gguf(tmp_path / "tied.gguf", "Q4_K", tied=True)
    loaded = load(path, weights="auto")
    assert loaded.spec is not None and loaded.spec.weights == "gguf"
    head, embedding = loaded.model.get_output_embeddings(), loaded.model.get_input_embeddings()
    assert isinstance(head, blocks.BlockLinear) and isinstance(embedding, blocks.BlockEmbedding)
    assert head.rows.data_ptr() == embedding.rows.data_ptr()  # a tied head reads the embedding's blocks
    mapped = memory.mapped_file_ranges(".gguf")
    linears = [m for m in loaded.model.modules() if isinstance(m, blocks.BlockLinear)]
    assert len(linears) == 2 * 7 + 1 and all(memory.in_ranges(m.rows, mapped) for m in linears)
    kept = sum(f.stat().st_size for f in private_cache.rglob("*") if f.is_file())
    assert kept < 0.2 * path.stat().st_size and not list(private_cache.rglob("*.safetensors"))
    assert loaded.tokenizer is None  # the tiny file has none


def test_a_block_type_without_a_kernel_is_a_clear_error(tmp_path: Path) -> None:
    path = write_tiny_gguf(tmp_path / "q3.gguf", "Q3_K")
    with pytest.raises(ModelLoadError, match="block type Q3_K .* has no kernel here; use --weights dense"):
        load(path)


def test_gguf_weights_need_a_file(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="--weights gguf reads a GGUF file's blocks"):
        load(tmp_path)
