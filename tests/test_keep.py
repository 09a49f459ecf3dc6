"""`--keep`: the first tokens of the prompt (or all of it) stay attended under a context window.

Kept parts longer than the windowed prefill chunk (64) and than the window's own slack: TokenSwift
writes plain decoding's text, a stopped run resumes it exactly, the kept tokens are really seen once
the window has slid past them, and the choice is resolved, recorded and refused as the user reads it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers import first_divergence, random_heads, random_prompt, tiny_target

from tokenswift_cli.config import AutoWindow, ConfigError, ContextWindow, DraftConfig, ModelSpec, RunConfig
from tokenswift_cli.config import SamplingConfig as Sampling
from tokenswift_cli.engine.decode import generate, generate_tokens
from tokenswift_cli.engine.state import full_capacity, prefill
from tokenswift_cli.model.cache import FullCache
from tokenswift_cli.model.target import Target
from tokenswift_cli.parsing import parse_keep, parse_window
from tokenswift_cli.runs import checkpoint
from tokenswift_cli.runs.checkpoint import Checkpointer, read_manifest, restore
from tokenswift_cli.runs.run_model import WINDOWED_PREFILL_CHUNK, fit_window
from tokenswift_cli.runs.textstream import StreamState
from tokenswift_cli.sampling.defaults import EMBEDDED_WINDOW_SPAN, automatic_window

KEPT = ContextWindow(size=96, sinks=90)  # more kept tokens than a prefill chunk
SAMPLING = Sampling(temperature=1.0, min_p=0.05, penalty=1.2, penalty_window=32, seed=11)


@pytest.mark.parametrize("sampling", [Sampling(), SAMPLING], ids=["greedy", "sampling"])
def test_tokenswift_equals_plain_with_a_long_kept_part(family: str, sampling: Sampling) -> None:
    target = tiny_target(family)
    heads, prompt = random_heads(target), random_prompt(130)
    cfg = RunConfig(max_new_tokens=300, sampling=sampling, window=KEPT, prefill_chunk=WINDOWED_PREFILL_CHUNK)
    plain, _ = generate_tokens(target, None, prompt, cfg.replace(mode="plain"))
    for source in ("pass", "verify"):
        fast, stats = generate_tokens(target, heads, prompt, cfg.replace(draft=DraftConfig(source=source)))
        assert first_divergence(fast, plain) is None
        assert stats.iterations < len(plain)
    unkept, _ = generate_tokens(target, None, prompt, cfg.replace(mode="plain", window=ContextWindow(96, sinks=4)))
    assert unkept != plain  # what is kept changes the model, so the equality above means something


@pytest.mark.parametrize("sampling", [Sampling(), SAMPLING], ids=["greedy", "sampling"])
def test_keeping_the_whole_prompt_is_lossless(sampling: Sampling) -> None:
    """`--keep prompt` resolved for a 100-token request: every prompt token stays in view."""
    target = tiny_target("qwen2")
    heads, prompt = random_heads(target), random_prompt(100, seed=2)
    asked = RunConfig(max_new_tokens=260, sampling=sampling, window=parse_window("128", parse_keep("prompt")))
    cfg = fit_window(asked, ModelSpec(), target, prefix=len(prompt))
    assert cfg.window == ContextWindow(size=128, sinks=100)
    plain, _ = generate_tokens(target, None, prompt, cfg.replace(mode="plain"))
    fast, _ = generate_tokens(target, heads, prompt, cfg)
    assert first_divergence(fast, plain) is None


def _last_logits(target: Target, tokens: list[int], window: ContextWindow) -> torch.Tensor:
    """The next-token logits after `tokens`, prefilled under `window` as a run does."""
    cfg = RunConfig(max_new_tokens=1, window=window, prefill_chunk=WINDOWED_PREFILL_CHUNK)
    full = FullCache(target.num_layers, full_capacity(cfg, len(tokens)), window=window)
    for start in range(0, len(tokens), WINDOWED_PREFILL_CHUNK):
        chunk = torch.tensor(tokens[start : start + WINDOWED_PREFILL_CHUNK])
        forward = target.forward(chunk, full)
        full.commit(range(chunk.shape[0]))
        full.evict()
    assert full.dropped > 0  # the window slid past the kept part
    return target.logits(forward.hidden[-1])


def test_kept_tokens_are_seen_and_dropped_ones_are_not() -> None:
    """Long after the window slid past them (two layers: 2 x 96 positions of reach), a kept token
    still moves the next token's logits; a token just after the kept part does not."""
    target = tiny_target("llama-gqa")
    tokens = random_prompt(420)
    base = _last_logits(target, tokens, KEPT)
    kept, dropped = list(tokens), list(tokens)
    kept[70] = (kept[70] + 1) % 90 + 2  # inside the 90 kept tokens
    dropped[100] = (dropped[100] + 1) % 90 + 2  # past them, out of every window since
    assert not torch.allclose(_last_logits(target, kept, KEPT), base, atol=1e-4)
    assert torch.equal(_last_logits(target, dropped, KEPT), base)
    few = ContextWindow(size=96, sinks=4)  # with 4 kept, token 70 is dropped too
    assert torch.equal(_last_logits(target, kept, few), _last_logits(target, tokens, few))


@pytest.mark.parametrize("segment", [512, 16])
def test_a_run_with_a_long_kept_part_resumes_exactly(
    tmp_path: Path, segment: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Resumed from checkpoints whose KV files straddle the kept part (16) or hold it whole (512),
    with the window recorded in the settings and read back (a resume uses the recorded keep)."""
    monkeypatch.setattr(checkpoint, "SEGMENT", segment)
    target = tiny_target("llama-gqa", seed=3)
    heads = random_heads(target)
    cfg = RunConfig(max_new_tokens=260, sampling=SAMPLING, window=KEPT, prefill_chunk=WINDOWED_PREFILL_CHUNK)
    prompt = random_prompt(120, seed=4)
    reference, _ = generate_tokens(target, heads, prompt, cfg)
    state = prefill(target, prompt, cfg)
    saver = Checkpointer(tmp_path, fingerprints={"model": "m" * 64, "heads": None})
    for count, _ in enumerate(generate(target, heads, state, cfg)):
        if count % 5 == 0:
            saver.save(state, stream=StreamState((), 0), text_bytes=0)
        if state.stats.generated >= 150:
            break
    saver.save(state, stream=StreamState((), 0), text_bytes=0)
    manifest = read_manifest(tmp_path)
    assert manifest is not None
    recorded = RunConfig.from_dict(cfg.to_dict())
    assert recorded.window == KEPT
    back = restore(
        tmp_path, manifest, cfg=recorded, num_layers=target.num_layers, device=target.device, dtype=torch.float32
    )
    for _ in generate(target, heads, back.state, recorded):
        pass
    assert len(reference) == cfg.max_new_tokens
    assert back.state.generated[: len(reference)] == reference  # the last step may commit past the target


def test_old_runs_recorded_sinks_read_as_the_kept_part() -> None:
    """Settings written before --keep (a window of size and sinks) resume with that window."""
    old = RunConfig(max_new_tokens=10, window=ContextWindow(size=4092, sinks=4)).to_dict()
    assert old["window"] == {"size": 4092, "sinks": 4}
    assert RunConfig.from_dict(old).window == ContextWindow(size=4092, sinks=4)
    unresolved = RunConfig(max_new_tokens=10, window=AutoWindow(sinks="prompt", span=4096)).to_dict()
    assert RunConfig.from_dict(unresolved).window == AutoWindow(sinks="prompt", span=4096)


def test_keep_is_resolved_against_the_prompt_and_fits_the_span() -> None:
    target = tiny_target("qwen2")  # trained on 4096 positions
    long_run = RunConfig(max_new_tokens=4000, window=automatic_window("default", "prompt"))
    assert long_run.window == AutoWindow(sinks="prompt", span=EMBEDDED_WINDOW_SPAN)
    # The whole 300-token prompt kept: the recent part shrinks so that the span stays 4,096.
    assert fit_window(long_run, ModelSpec(), target, prefix=300).window == ContextWindow(size=3796, sinks=300)
    assert fit_window(long_run.replace(max_new_tokens=100), ModelSpec(), target, prefix=300).window is None
    # A count: at most the prompt's tokens (as llama.cpp), and the trained span for other models.
    counted = long_run.replace(window=automatic_window("some/model", 200))
    assert fit_window(counted, ModelSpec(), target, prefix=150).window == ContextWindow(size=3946, sinks=150)
    explicit = long_run.replace(window=parse_window("1k", 200))
    assert fit_window(explicit, ModelSpec(), target, prefix=150).window == ContextWindow(size=1000, sinks=150)


def test_a_keep_of_more_than_half_the_span_is_a_one_line_error() -> None:
    target = tiny_target("qwen2")
    whole = RunConfig(max_new_tokens=4000, window=automatic_window("default", "prompt"))
    with pytest.raises(ConfigError, match=r"--keep prompt \(the whole prompt: 2100 tokens\) leaves 1996 ") as error:
        fit_window(whole, ModelSpec(), target, prefix=2100)
    assert "\n" not in str(error.value) and "at most half" in str(error.value)
    assert fit_window(whole, ModelSpec(), target, prefix=2048).window == ContextWindow(size=2048, sinks=2048)
    explicit = whole.replace(window=parse_window("256", "prompt"))
    with pytest.raises(ConfigError, match="--keep prompt"):
        fit_window(explicit, ModelSpec(), target, prefix=300)
    with pytest.raises(ConfigError, match="--keep 3000 leaves 1096 of the context window's 4096 positions"):
        automatic_window("default", 3000)  # before any model loads
    with pytest.raises(ConfigError, match="--keep 300 leaves 256"):
        parse_window("256", 300)
    with pytest.raises(ConfigError, match="bad --keep 'all'"):
        parse_keep("all")


def test_write_keeps_the_whole_request_and_resume_uses_it(tmp_path: Path) -> None:
    """`write --prompt` on a model with a chat template: the window keeps the templated request
    (recorded), and a run continued by `resume --tokens` writes what one longer run writes."""
    import json

    from cli_helpers import WORDS, build_tiny_folder, cli, one_thread, with_chat_template

    folder = with_chat_template(build_tiny_folder(tmp_path / "tiny"))
    request = " ".join(WORDS[:80])
    common = ("--prompt", request, "-m", folder, "--context-window", "96", "--heads", "none", "-q", "--seed", "3")
    with one_thread():
        assert cli("write", "-n", 100, *common, "--runs-dir", tmp_path / "a").exit_code == 0
        assert cli("resume", "run-001", "--tokens", 260, "--runs-dir", tmp_path / "a").exit_code == 0
        assert cli("write", "-n", 260, *common, "--runs-dir", tmp_path / "b").exit_code == 0
    settings = json.loads((tmp_path / "a" / "run-001" / "settings.json").read_text())
    assert settings["prefix"]["tokens"] == 80 and settings["run_config"]["window"] == {"size": 96, "sinks": 80}
    texts = [(tmp_path / side / "run-001" / "text.txt").read_text() for side in "ab"]
    assert texts[0] == texts[1] and len(texts[0].split()) > 200
