"""On a CUDA device (`make test-gpu`, `pytest -m gpu`; skipped elsewhere): the padded backend's rows are bit-
independent of the rows beside them, TokenSwift == plain decoding (greedy and seeded) on tiny models, on a
medium random model and on the embedded one, sampling on the device, and `--device auto` split cuda:0/cpu."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from conftest import tiny_model
from helpers import first_divergence, random_heads, random_prompt
from padded_checks import GREEDY, SEEDED, WINDOW, chain_rows_differing, tokenswift_equals_plain, tree_rows_differing
from transformers import AutoModelForCausalLM, LlamaConfig

from tokenswift_cli.backends.cuda.graphs import GRAPHS, SPAN_STEP
from tokenswift_cli.backends.cuda.padded import PaddedBackend
from tokenswift_cli.backends.cuda.replay import Replays
from tokenswift_cli.config import DraftConfig, ModelSpec, RunConfig, SamplingConfig
from tokenswift_cli.data import DEFAULT_TEXT
from tokenswift_cli.engine.decode import generate, generate_tokens
from tokenswift_cli.engine.state import prefill
from tokenswift_cli.engine.tree import build_tree
from tokenswift_cli.engine.walk import WALK
from tokenswift_cli.model.target import Target
from tokenswift_cli.runs.checkpoint import Checkpointer, read_manifest, restore
from tokenswift_cli.runs.textstream import StreamState
from tokenswift_cli.sampling.distribution import choose

pytestmark = pytest.mark.gpu
DTYPES = [torch.bfloat16, torch.float16, torch.float32]
TREE = build_tree(5, [(1, 2, 3), (4, 5), (6, 7)], [(9, 9, 9, 9, 9)])
PAPER = SamplingConfig(temperature=1.0, min_p=0.1, penalty=1.2, penalty_window=1024, seed=0)


def on_cuda(model: torch.nn.Module, dtype: torch.dtype) -> Target:
    target = Target(model.to(device="cuda", dtype=dtype))
    assert isinstance(target.backend, PaddedBackend)
    return target


def medium_model() -> torch.nn.Module:
    """Random weights at shapes where cuBLAS picks real kernels (tiny ones may all take one)."""
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=4096, hidden_size=1024, intermediate_size=2816, num_hidden_layers=4, num_attention_heads=16,
        num_key_value_heads=4, max_position_embeddings=4096, tie_word_embeddings=False,
    )  # fmt: skip
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        model.get_output_embeddings().weight.normal_(0.0, 0.35 / 4)
    return model.eval()


@pytest.mark.parametrize("dtype", DTYPES)
def test_rows_1_to_64_get_the_bits_of_one_row_forwards(family: str, dtype: torch.dtype) -> None:
    assert chain_rows_differing(on_cuda(tiny_model(family), dtype), 64) == []
    assert chain_rows_differing(on_cuda(tiny_model(family), dtype), 70) == []  # two pieces


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_medium_model_keeps_each_rows_bits(dtype: torch.dtype) -> None:
    target = on_cuda(medium_model(), dtype)
    assert chain_rows_differing(target, 64, prompt_length=700) == []
    assert tree_rows_differing(target, TREE, prompt_length=700) == []


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["greedy", "seeded"])
@pytest.mark.parametrize("window", [None, WINDOW], ids=["full", "window"])
def test_tokenswift_equals_plain_on_tiny_models(family: str, sampling: SamplingConfig, window) -> None:  # type: ignore[no-untyped-def]
    divergence, iterations, tokens = tokenswift_equals_plain(
        on_cuda(tiny_model(family), torch.bfloat16), sampling, window=window
    )
    assert divergence is None and iterations < tokens


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_cuda_graphs_write_the_eager_text(sampling: SamplingConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    """Plain decoding replayed from CUDA graphs (across two spans) writes the text of eager forwards."""
    prompt = random_prompt(SPAN_STEP - 100)
    cfg = RunConfig(max_new_tokens=150, sampling=sampling, prefill_chunk=256, mode="plain")
    texts = {}
    for mode in ("0", "1"):
        monkeypatch.setenv(GRAPHS, mode)
        target = on_cuda(tiny_model("llama-gqa"), torch.bfloat16)
        texts[mode] = generate_tokens(target, None, prompt, cfg)[0]
    graphs = target.backend.graphs
    assert graphs is not None and len(graphs.captured) == (1 if target.backend.kernel_attention else 2)
    assert all(captured.graph is not None for captured in graphs.captured.values())
    assert first_divergence(texts["1"], texts["0"]) is None


@pytest.mark.parametrize("dot", [False, True], ids=["registers", "dot"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_the_attention_kernels_give_float64_attentions_bits(dtype: torch.dtype, dot: bool) -> None:
    """Compiled for this GPU: the bits of the torch version, a row's bits alone and among 64, 8B-shaped heads."""
    from tokenswift_cli.backends.cuda.attention_kernel import agrees, kernel_attention
    from tokenswift_cli.backends.cuda.float64_attention import float64_attention

    assert agrees(torch.device("cuda"), dtype) is None
    held, rows, generator = 5000, 64, torch.Generator().manual_seed(1)
    query, keys, values = (torch.randn(*shape, generator=generator).to("cuda", dtype) for shape in (
        (1, 32, rows, 128), (1, 8, held + rows + 100, 128), (1, 8, held + rows + 100, 128)))  # fmt: skip
    mask = TREE.mask.cuda()
    visible = torch.eye(rows, dtype=torch.bool, device="cuda")
    visible[: TREE.size, : TREE.size] = mask
    together = kernel_attention(query, keys, values, torch.tensor(held, device="cuda"), tree_visible=visible,
                                scaling=0.088, dot=dot)  # fmt: skip
    expected = float64_attention(
        query, keys[:, :, :held], values[:, :, :held], keys[:, :, held : held + rows],
        values[:, :, held : held + rows], tree_visible=visible, scaling=0.088,
    )  # fmt: skip
    if dtype == torch.float32:  # float32 products are not exact in float64: a score may round the other way
        torch.testing.assert_close(together, expected, rtol=1e-6, atol=1e-7)  # (seen once on an H200)
    else:
        assert torch.equal(together, expected)
    for row in (0, 5, 26):
        alone = kernel_attention(query[:, :, row : row + 1], keys, values, held, tree_visible=visible[row : row + 1],
                                 scaling=0.088, dot=dot)  # fmt: skip
        assert torch.equal(alone[0, 0], together[0, row])


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_tokenswift_equals_plain_on_a_medium_model(sampling: SamplingConfig) -> None:
    divergence, _, _ = tokenswift_equals_plain(on_cuda(medium_model(), torch.bfloat16), sampling, tokens=300)
    assert divergence is None


WALKS = {  # windows the 150-token prompt fills: the walks replay CUDA graphs
    "greedy": SamplingConfig(penalty_window=64),
    "paper": SamplingConfig(temperature=1.0, min_p=0.1, penalty=1.2, penalty_window=64, seed=0),
    "dry": SamplingConfig(temperature=1.0, min_p=0.05, penalty=1.1, penalty_window=64, dry_multiplier=0.8,
                          dry_range=96, seed=4),
}  # fmt: skip


@pytest.mark.parametrize("sampling", list(WALKS.values()), ids=list(WALKS))
def test_the_walk_on_the_device_draws_the_host_walks_tokens(sampling: SamplingConfig, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Plain decoding walked on the host, TokenSwift walked on the device from CUDA graphs (one read-back):
    the same text."""
    target = on_cuda(tiny_model("llama-gqa"), torch.bfloat16)
    heads, prompt = random_heads(target).to(device=target.device, dtype=target.dtype), random_prompt(150)
    cfg = RunConfig(max_new_tokens=200, sampling=sampling, prefill_chunk=32)
    monkeypatch.setenv(WALK, "host")
    plain, _ = generate_tokens(target, None, prompt, cfg.replace(mode="plain"))
    monkeypatch.setenv(WALK, "device")
    fast, stats = generate_tokens(target, heads, prompt, cfg.replace(draft=DraftConfig(tree=(1, 3, 3, 3))))
    assert first_divergence(fast, plain) is None and stats.iterations < len(plain)
    captured = Replays.of(target, target.device).captured
    assert captured and all(graph is not None for graph, _, _ in captured.values())


def test_draws_on_the_device_are_the_draws_on_the_cpu() -> None:
    torch.manual_seed(1)
    cfg = SamplingConfig(temperature=1.0, min_p=0.0, seed=2)  # min-p 0: every score finite, the full CDF
    for _ in range(50):
        logits, context = torch.randn(49152) * 3, torch.randint(0, 49152, (64,))
        for position in (0, 17, 10**6):
            assert choose(logits.cuda(), context, position, cfg) == choose(logits, context, position, cfg)


def split_model(dtype: torch.dtype, placement: str) -> torch.nn.Module:
    """The tiny llama with accelerate's `max_memory` putting the embeddings and layer 0 on cuda:0, the rest on cpu.

    "split": the cpu layers compute on the cpu (accelerate's `main_device="cpu"`); "offload": accelerate's
    default for a model beyond the GPU's memory, the cpu layers' weights on `meta`, brought to cuda:0 per call.
    """
    from accelerate import dispatch_model, infer_auto_device_map

    model = tiny_model("llama-gqa").to(dtype)
    size = sum(p.numel() * p.element_size() for p in [*model.model.embed_tokens.parameters(),
                                                      *model.model.layers[0].parameters()])  # fmt: skip
    layer = sum(p.numel() * p.element_size() for p in model.model.layers[0].parameters())
    device_map = infer_auto_device_map(  # accelerate keeps a layer's room free on the GPU when it offloads
        model, max_memory={0: size + layer + 1024, "cpu": 2**30}, no_split_module_classes=["LlamaDecoderLayer"]
    )  # (without it, layer 0 went to the CPU too: the H200 runs of 2026-11-27, at 83869e8 and 8c03ef4)
    assert set(device_map.values()) == {0, "cpu"}, device_map
    return dispatch_model(model, device_map, main_device="cpu" if placement == "split" else None)


PLACEMENTS = {"split": {"cuda", "cpu"}, "offload": {"cuda"}}  # the layers' execution devices


@pytest.mark.parametrize("placement", list(PLACEMENTS))
@pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_device_auto_between_cuda_and_cpu_is_lossless(sampling: SamplingConfig, placement: str) -> None:
    target = Target(split_model(torch.float32, placement))
    assert {d.type for d in target.layer_devices} == PLACEMENTS[placement]
    divergence, iterations, tokens = tokenswift_equals_plain(target, sampling, tokens=120)
    assert divergence is None and iterations < tokens


@pytest.mark.parametrize("placement", list(PLACEMENTS))
def test_device_auto_keeps_each_layers_cache_on_its_device_through_a_resume(tmp_path: Path, placement: str) -> None:
    target = Target(split_model(torch.float32, placement))
    heads = random_heads(target).to(device=target.output_device)
    cfg = RunConfig(max_new_tokens=80, sampling=SEEDED, draft=DraftConfig(partial_budget=64, sink_tokens=4,
                                                                          recent_window=16))  # fmt: skip
    state = prefill(target, random_prompt(90), cfg)
    for _ in generate(target, heads, state, cfg):
        if state.stats.generated >= 40:
            break
    for layer, device in zip(state.full.layer_list, target.layer_devices, strict=True):
        assert layer.keys is not None and layer.keys.device.type == device.type
    Checkpointer(tmp_path, fingerprints={"model": "m" * 64, "heads": None}).save(
        state, stream=StreamState((1,), 1), text_bytes=0
    )
    manifest = read_manifest(tmp_path)
    assert manifest is not None
    back = restore(tmp_path, manifest, cfg=cfg, num_layers=target.num_layers, device=target.device,
                   dtype=target.dtype, layer_devices=target.layer_devices).state  # fmt: skip
    for layer, device in zip(back.full.layer_list, target.layer_devices, strict=True):
        assert layer.keys is not None and layer.keys.device.type == device.type
    for _ in generate(target, heads, back, cfg):
        pass
    assert back.stats.generated >= cfg.max_new_tokens - 40


@pytest.mark.parametrize("sampling", [GREEDY, PAPER], ids=["greedy", "paper"])
def test_a_run_checkpointed_on_the_gpu_resumes_to_the_uninterrupted_text(tmp_path: Path, sampling) -> None:  # type: ignore[no-untyped-def]
    """bfloat16 on CUDA (graphs, the walk on the device): stopped at 70 tokens, saved, restored, continued."""
    target = on_cuda(tiny_model("llama-gqa"), torch.bfloat16)
    heads, prompt = random_heads(target).to(device=target.device, dtype=target.dtype), random_prompt(90)
    cfg = RunConfig(max_new_tokens=160, sampling=sampling, draft=DraftConfig(partial_budget=64, sink_tokens=4,
                                                                              recent_window=16))  # fmt: skip
    reference = prefill(target, prompt, cfg)
    for _ in generate(target, heads, reference, cfg):
        pass
    state = prefill(target, prompt, cfg)
    for _ in generate(target, heads, state, cfg):
        if state.stats.generated >= 70:
            break
    Checkpointer(tmp_path, fingerprints={"model": "m" * 64, "heads": None}).save(
        state, stream=StreamState((1,), 1), text_bytes=0
    )
    manifest = read_manifest(tmp_path)
    assert manifest is not None
    back = restore(tmp_path, manifest, cfg=cfg, num_layers=target.num_layers, device=target.device,
                   dtype=target.dtype).state  # fmt: skip
    for _ in generate(target, heads, back, cfg):
        pass
    end = back.prefix_length + cfg.max_new_tokens
    assert first_divergence(back.tokens[:end], reference.tokens[:end]) is None


EMBEDDED_TOKENS = int(os.environ.get("TOKENSWIFT_GPU_EMBEDDED_TOKENS", "1500"))


@pytest.mark.parametrize("sampling", [SamplingConfig(), PAPER], ids=["greedy", "paper"])
def test_tokenswift_equals_plain_on_the_embedded_model(sampling: SamplingConfig) -> None:
    """The embedded model (its GGUF staged by gpu/stage2.sh; skipped without it), bfloat16, shipped heads."""
    from tokenswift_cli.model.heads import load_heads, shipped_heads
    from tokenswift_cli.model.loading import ModelLoadError, load_model

    try:
        loaded = load_model(ModelSpec(device="cuda", dtype="bfloat16", weights="dense"))
    except ModelLoadError as error:
        pytest.skip(f"the embedded model is not staged here: {error}")
    assert loaded.tokenizer is not None
    target = Target(loaded.model)
    heads_path = shipped_heads("default")
    assert heads_path is not None
    heads = load_heads(heads_path, loaded.model.config, fingerprint=loaded.fingerprint)
    heads = heads.to(device=target.output_device, dtype=target.dtype)
    prefix = loaded.tokenizer(DEFAULT_TEXT.read_text(encoding="utf-8"))["input_ids"][:2048]  # public domain
    cfg = RunConfig(max_new_tokens=EMBEDDED_TOKENS, sampling=sampling, window=None)
    plain, _ = generate_tokens(target, None, prefix, cfg.replace(mode="plain"))
    fast, stats = generate_tokens(target, heads, prefix, cfg)
    assert first_divergence(fast, plain) is None
    assert stats.iterations < len(plain)
