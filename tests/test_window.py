"""The context window (attention sinks + recent positions): one definition, computed three ways.

A dense reference registered as a `transformers` attention function (the whole sequence at once,
sink keys re-rotated as StreamingLLM's cache positions place them) against windowed plain decoding,
and windowed TokenSwift against windowed plain decoding; the cache stays bounded; resume is exact.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers import first_divergence, random_heads, random_prompt, tiny_target
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
from transformers.models.llama.modeling_llama import rotate_half

from tokenswift_cli.config import (
    AutoWindow,
    ConfigError,
    ContextWindow,
    DraftConfig,
    ModelSpec,
    RunConfig,
    SamplingConfig,
)
from tokenswift_cli.engine.decode import generate, generate_tokens
from tokenswift_cli.engine.state import TREE_HEADROOM, full_capacity, prefill
from tokenswift_cli.model.attention import window_attention
from tokenswift_cli.model.target import Target
from tokenswift_cli.runs import checkpoint
from tokenswift_cli.runs.checkpoint import Checkpointer, read_manifest, restore
from tokenswift_cli.runs.run_model import WINDOWED_PREFILL_CHUNK, fit_window
from tokenswift_cli.runs.textstream import StreamState
from tokenswift_cli.sampling.defaults import automatic_window

WINDOW = ContextWindow(size=48, sinks=4)
SAMPLING = SamplingConfig(temperature=1.0, min_p=0.05, penalty=1.2, penalty_window=32, seed=7)


def rotate(x: torch.Tensor, angle_positions: torch.Tensor, dim: int, base: float = 10000.0) -> torch.Tensor:
    """Plain RoPE of `x` `[..., n, dim]` at `angle_positions` `[n]` (the llama convention)."""
    inv_freq = 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    angles = angle_positions.double()[:, None] * inv_freq[None]
    emb = torch.cat([angles, angles], dim=-1)
    return (x.double() * emb.cos() + rotate_half(x.double()) * emb.sin()).float()


def streaming_reference(raw_q, raw_k, values, positions, window: ContextWindow) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """Row by row over keys at positions 0..n-1: the visible ones, sinks rotated to sit just before the window."""
    dim, heads, kv = raw_q.shape[-1], raw_q.shape[1], raw_k.shape[1]
    out = torch.zeros(1, heads, positions.shape[0], dim)
    key_positions = torch.arange(raw_k.shape[2])
    v_all = values.repeat_interleave(heads // kv, dim=1)
    for row, p in enumerate(positions.tolist()):
        shift = max(0, p - window.span + 1)
        sink_keys = rotate(raw_k[:, :, : window.sinks], key_positions[: window.sinks] + shift, dim)
        rest = rotate(raw_k[:, :, window.sinks :], key_positions[window.sinks :], dim)
        k_all = torch.cat([sink_keys, rest], dim=2).repeat_interleave(heads // kv, dim=1)
        q = rotate(raw_q[:, :, row : row + 1], torch.tensor([p]), dim)
        visible = (key_positions <= p) & ((key_positions < window.sinks) | (key_positions > p - window.size))
        scores = (q @ k_all.transpose(-1, -2))[..., visible] * dim**-0.5
        out[:, :, row] = (scores.softmax(-1) @ v_all[:, :, visible])[:, :, 0]
    return out.transpose(1, 2).reshape(1, positions.shape[0], -1)


TRIE_DEPTHS = torch.tensor([0, 1, 1, 2, 3])  # 0 -> (1, 2); 1 -> 3 -> 4
TRIE_MASK = torch.tensor([[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 0, 1, 0, 0], [1, 1, 0, 1, 0], [1, 1, 0, 1, 1]]).bool()


@pytest.mark.parametrize("committed", [10, 52, 120])
@pytest.mark.parametrize("tree", [False, True])
@pytest.mark.parametrize("evicted", [False, True])
def test_window_attention_matches_a_row_by_row_reference(committed: int, tree: bool, evicted: bool) -> None:
    torch.manual_seed(committed)
    window, q_len, dim = WINDOW, 5, 16
    raw_q, raw_k = torch.randn(1, 4, q_len, dim), torch.randn(1, 2, committed + q_len, dim)
    values = torch.randn(1, 2, committed + q_len, dim)
    depths = TRIE_DEPTHS if tree else torch.arange(q_len)
    block = TRIE_MASK if tree else torch.ones(q_len, q_len, dtype=torch.bool).tril()
    positions = committed + depths
    expected = torch.cat(
        [  # each row alone over its own keys: the cache, then its ancestors (consecutive positions)
            streaming_reference(
                raw_q[:, :, row : row + 1], raw_k[:, :, order], values[:, :, order], positions[row : row + 1], window
            )  # fmt: skip
            for row in range(q_len)
            for order in [torch.cat([torch.arange(committed), committed + torch.nonzero(block[row]).flatten()])]
        ],
        dim=1,
    )
    # The cache as the model holds it: keys rotated at their positions, what no row sees dropped.
    keys = rotate(raw_k, torch.cat([torch.arange(committed), positions]), dim)
    first_recent = max(window.sinks, int(positions.min()) - window.size + 1) if evicted else window.sinks
    held = torch.cat([torch.arange(window.sinks), torch.arange(first_recent, committed + q_len)])
    got = window_attention(
        rotate(raw_q, positions, dim), rotate(raw_q, positions.clamp(max=window.span - 1), dim),
        keys[:, :, held], values[:, :, held], positions=positions, committed=committed, first_recent=first_recent,
        sinks=window.sinks, size=window.size, block_mask=block, scaling=dim**-0.5,
    )  # fmt: skip
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-4)


def register_reference(target: Target) -> str:
    """The reference as the stock decoder's attention function (no cache: the whole text at once)."""
    rotary = target.decoder.rotary_emb

    def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):  # type: ignore[no-untyped-def]
        length, dim = query.shape[2], query.shape[-1]
        positions = torch.arange(length)
        # Undo the model's own rotation to get raw queries/keys (exact up to rounding for plain RoPE).
        cos, sin = rotary(query, positions[None])
        unrotate = lambda x: x * cos[:, None] - rotate_half(x) * sin[:, None]  # noqa: E731
        out = streaming_reference(unrotate(query), unrotate(key), value, positions, WINDOW)
        return out.reshape(1, length, -1, dim), None

    AttentionInterface.register("streaming_reference", attention)
    AttentionMaskInterface.register("streaming_reference", sdpa_mask)
    return "streaming_reference"


def test_windowed_greedy_matches_the_stock_decoder_with_a_reference_attention() -> None:
    target = tiny_target("llama-gqa")
    prompt = random_prompt(60)
    cfg = RunConfig(max_new_tokens=70, mode="plain", window=WINDOW, prefill_chunk=16)
    generated, _ = generate_tokens(target, None, prompt, cfg)
    text = torch.tensor([prompt + generated[:-1]])
    model = target.model
    model.set_attn_implementation(register_reference(target))
    try:
        with torch.no_grad():
            logits = model(text, use_cache=False).logits[0]
    finally:
        model.set_attn_implementation("tokenswift")
    expected = logits[len(prompt) - 1 :].argmax(-1).tolist()
    assert first_divergence(generated, expected) is None
    unwindowed, _ = generate_tokens(target, None, prompt, cfg.replace(window=None))
    assert unwindowed != generated  # the window changed the model, so the comparison above means something


@pytest.mark.parametrize("sampling", [SamplingConfig(), SAMPLING], ids=["greedy", "sampling"])
def test_windowed_tokenswift_equals_windowed_plain(family: str, sampling: SamplingConfig) -> None:
    target = tiny_target(family)
    heads, prompt = random_heads(target), random_prompt(150)
    cfg = RunConfig(max_new_tokens=260, sampling=sampling, window=WINDOW, prefill_chunk=32)
    plain, _ = generate_tokens(target, None, prompt, cfg.replace(mode="plain"))
    for source in ("pass", "verify"):
        fast, stats = generate_tokens(target, heads, prompt, cfg.replace(draft=DraftConfig(source=source)))
        assert first_divergence(fast, plain) is None
        assert stats.iterations < len(plain)


def test_the_window_changes_nothing_before_its_span() -> None:
    target = tiny_target("qwen2")
    prompt = random_prompt(20)
    cfg = RunConfig(max_new_tokens=WINDOW.span - 20, mode="plain")
    windowed = cfg.replace(window=WINDOW)
    assert generate_tokens(target, None, prompt, cfg)[0] == generate_tokens(target, None, prompt, windowed)[0]


def test_the_windowed_cache_stays_bounded() -> None:
    target = tiny_target("llama-gqa")
    cfg = RunConfig(max_new_tokens=400, mode="plain", window=WINDOW)  # a prefill chunk longer than the window
    state = prefill(target, random_prompt(100), cfg)
    most = 0
    for _ in generate(target, None, state, cfg):
        layer = state.full.layer_list[0]
        most = max(most, layer.stored)
        assert state.full.first_recent <= len(state.tokens) - WINDOW.size + 1 or state.full.dropped == 0
    assert len(state.tokens) == 500 and most <= WINDOW.span + WINDOW.size // 4
    assert state.full.layer_list[0].capacity == full_capacity(cfg, 100) < 500 + TREE_HEADROOM  # never grew


@pytest.mark.parametrize("segment", [512, 16])
def test_a_windowed_run_resumes_exactly(tmp_path: Path, segment: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(checkpoint, "SEGMENT", segment)  # 16: files fall out of the window one by one
    target = tiny_target("llama-gqa", seed=3)
    heads = random_heads(target)
    cfg = RunConfig(max_new_tokens=240, sampling=SAMPLING, window=WINDOW, prefill_chunk=16)
    prompt = random_prompt(90, seed=4)
    reference, _ = generate_tokens(target, heads, prompt, cfg)
    state = prefill(target, prompt, cfg)
    saver = Checkpointer(tmp_path, fingerprints={"model": "m" * 64, "heads": None})
    for count, _ in enumerate(generate(target, heads, state, cfg)):
        if count % 7 == 0:  # several checkpoints, some after positions were dropped unsaved
            saver.save(state, stream=StreamState((), 0), text_bytes=0)
            kv = [e for e in saver.manifest["files"] if e["kind"] == "kv"] if saver.manifest else []
            # On disk: the sinks and what the window still sees, not every position ever written.
            needed_from = len(state.tokens) - WINDOW.size + 1
            assert all(e["start"] < WINDOW.sinks or e["end"] > needed_from for e in kv)
            assert sum(e["end"] - e["start"] for e in kv) <= WINDOW.span + WINDOW.size // 4 + 7 * 8
            assert {p.name for p in (tmp_path / "checkpoint").iterdir()} == {
                e["name"] for e in saver.manifest["files"]
            } | {"manifest.json"}
        if state.stats.generated >= 120:
            break
    saver.save(state, stream=StreamState((), 0), text_bytes=0)
    manifest = read_manifest(tmp_path)
    assert manifest is not None
    back = restore(tmp_path, manifest, cfg=cfg, num_layers=target.num_layers, device=target.device, dtype=torch.float32)
    assert back.state.full.layer_list[0].stored <= WINDOW.span + WINDOW.size // 4
    for _ in generate(target, heads, back.state, cfg):
        pass
    assert back.state.generated == reference


def test_a_window_needs_the_lean_forward() -> None:
    target = Target(tiny_target("llama-gqa").model, lean=False)
    with pytest.raises(ConfigError, match="context window"):
        prefill(target, random_prompt(10), RunConfig(max_new_tokens=4, window=WINDOW))


def test_the_automatic_window_is_the_trained_length_once_a_run_outgrows_it() -> None:
    target = tiny_target("qwen2")  # trained on 4096 positions
    auto = RunConfig(max_new_tokens=4000, window=AutoWindow(sinks=8))
    windowed = fit_window(auto, ModelSpec(), target, prefix=200)
    assert windowed.window == ContextWindow(size=4088, sinks=8)
    assert windowed.prefill_chunk == WINDOWED_PREFILL_CHUNK < auto.prefill_chunk  # recorded: resumes prefill alike
    unwindowed = fit_window(auto, ModelSpec(), target, prefix=50)
    assert unwindowed.window is None and unwindowed.prefill_chunk == auto.prefill_chunk  # fits: as configured
    assert fit_window(auto, ModelSpec(rope_scaling="yarn"), target, prefix=200).window is None  # YaRN chosen
    stock = Target(target.model, lean=False)
    assert fit_window(auto, ModelSpec(), stock, prefix=200).window is None
    assert fit_window(auto.replace(window=WINDOW), ModelSpec(), target, prefix=200).window == WINDOW
    smaller = auto.replace(window=AutoWindow(sinks=4, size=1000))
    assert fit_window(smaller, ModelSpec(), target, prefix=200).window == ContextWindow(size=1000, sinks=4)
    assert automatic_window("default").size == 4092 and automatic_window("some/model").size is None
