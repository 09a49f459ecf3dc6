"""`heads eval`'s replay of the paper's draft pass, checked against the engine, and the CLI end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import PREFIX, build_tiny_folder, cli
from helpers import random_heads, random_prompt, tiny_target

from tokenswift_cli.config import RunConfig, SamplingConfig
from tokenswift_cli.engine.decode import generate_tokens
from tokenswift_cli.model.heads import read_metadata
from tokenswift_cli.train.acceptance import replay, write_text

SAMPLING = SamplingConfig(temperature=1.0, min_p=0.05, penalty=1.2, penalty_window=32, seed=3)


@pytest.mark.parametrize("greedy", [False, True])
@pytest.mark.parametrize("with_heads", [True, False])
def test_replay_commits_what_the_engine_commits(with_heads: bool, greedy: bool) -> None:
    """The replay's tokens per step on a text are the engine's own mean accepted length on it."""
    target = tiny_target("llama-gqa")
    heads = random_heads(target) if with_heads else None
    prompt = random_prompt(40) * 2  # a repeat, so that n-gram candidates are accepted too
    sampling = SamplingConfig() if greedy else SAMPLING
    cfg = RunConfig(max_new_tokens=120, sampling=sampling, kv_cache="model")
    out, stats = generate_tokens(target, heads, prompt, cfg)
    if greedy:  # `heads eval --greedy` writes its text as plain greedy decoding does
        assert write_text(target.model, prompt, 120, sampling)[len(prompt) :] == out
    result = replay(target.model, heads, [*prompt, *out], len(prompt), sampling=sampling, draft=cfg.draft)
    assert result.tokens == len(out) == stats.generated
    assert (result.heads if with_heads else result.no_heads) == pytest.approx(stats.mean_accepted)
    assert result.oracle > 1.0 and result.heads_no_lag >= 1.0
    assert min(result.heads_every_root, result.no_heads_every_root) >= 1.0
    assert 0.0 <= result.drawn_top1 <= result.drawn_top3 <= 1.0


def test_every_root_accepts_the_greedy_top_token() -> None:
    """On greedy text the base logits' top-1 is every next token: every root but the last accepts it."""
    target = tiny_target("llama-gqa")
    prompt = random_prompt(24)
    text = write_text(target.model, prompt, 40, SamplingConfig())
    result = replay(target.model, None, text, len(prompt), sampling=SamplingConfig())
    assert result.no_heads_every_root >= 1 + 39 / 40
    assert result.no_heads >= 40 / 21  # the walk: at most 20 steps of 2 and the last root's step


def test_train_heads_then_eval_on_a_tiny_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The flags of the prepared GPU run, at tiny sizes on the CPU: train, interrupt-safe files, eval."""
    monkeypatch.setenv("TOKENSWIFT_CACHE", str(tmp_path / "cache"))
    model = build_tiny_folder(tmp_path / "tiny")
    text = tmp_path / "held-out.txt"
    text.write_text(PREFIX * 8)
    out = tmp_path / "heads.safetensors"
    result = cli(
        "train-heads", "-m", model, "--device", "cpu", "--out", out, "--samples", 4, "--sample-tokens", 24,
        "--write-batch", 4, "--long-windows", 1, "--long-tokens", 48, "--held-out-samples", 2, "--steps", 6,
        "--batch-size", 16, "--target", "hard", "--parallel", "--num-heads", 2, "--eval-text", text,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    meta = read_metadata(out)
    assert meta["complete"] == "true" and meta["steps"] == "6" and meta["device"] == "cpu"
    assert meta["target"] == "hard" and meta["chained"] == "false" and meta["num_heads"] == "2"
    assert int(meta["rows"]) == 4 * (24 - 2) + (48 - 1 - 2) and float(meta["train_seconds"]) >= 0
    assert not (tmp_path / "heads.safetensors.state").exists()
    result = cli("heads", "eval", out, "-m", model, "--text", text, "--tokens", 64, "--prefix-tokens", 16,
                 "--new-tokens", 24, "--json")  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert set(report["accuracy"]) >= {"text all", "text <512"}
    (run,) = report["tokens_per_step"]
    assert run["tokens"] == 24 and min(run["oracle"], run["heads"], run["no_heads"]) >= 1.0
    assert report["settings"]["sampling"]["penalty"] == 1.2
