"""End to end on the embedded default model (SmolLM2-135M-Instruct): TokenSwift == plain == generate()."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from helpers import first_divergence
from test_capitals import in_a_row

from tokenswift_cli.config import DraftConfig, ModelSpec, RunConfig, SamplingConfig
from tokenswift_cli.engine.decode import generate_tokens
from tokenswift_cli.model.loading import load_model
from tokenswift_cli.model.target import Target
from tokenswift_cli.sampling.whitespace import longest_run

pytestmark = pytest.mark.slow
PROMPT = Path(__file__).parent.parent / "prompts" / "lighthouse-keeper.txt"


@pytest.fixture(scope="module")
def default_target() -> tuple[Target, list[int]]:
    loaded = load_model(ModelSpec(weights="dense"))  # generate() is matched bit for bit on dense weights
    prompt = loaded.tokenizer(PROMPT.read_text())["input_ids"]
    return Target(loaded.model), prompt


def test_greedy_256_tokens_tokenswift_equals_plain_and_generate(default_target) -> None:  # type: ignore[no-untyped-def]
    target, prompt = default_target
    # A budget smaller than the prompt + output, so that the partial cache is selected and refreshed.
    draft = DraftConfig(partial_budget=192, sink_tokens=8, recent_window=64)
    plain, _ = generate_tokens(target, None, prompt, RunConfig(max_new_tokens=256, mode="plain"))
    fast, stats = generate_tokens(target, None, prompt, RunConfig(max_new_tokens=256, draft=draft))
    assert first_divergence(fast, plain) is None
    assert stats.mean_accepted > 1.0

    model = target.model
    model.set_attn_implementation("sdpa")
    try:
        reference = model.generate(
            torch.tensor([prompt]), max_new_tokens=256, do_sample=False, eos_token_id=None, pad_token_id=0
        )[0, len(prompt) :].tolist()
    finally:
        model.set_attn_implementation("tokenswift")
    assert first_divergence(plain, reference) is None


def test_sampling_with_the_papers_settings_equals_plain(default_target) -> None:  # type: ignore[no-untyped-def]
    target, prompt = default_target
    sampling = SamplingConfig(temperature=1.0, min_p=0.1, penalty=1.2, penalty_window=1024, seed=7)
    plain, _ = generate_tokens(target, None, prompt, RunConfig(max_new_tokens=128, mode="plain", sampling=sampling))
    fast, _ = generate_tokens(target, None, prompt, RunConfig(max_new_tokens=128, sampling=sampling))
    assert first_divergence(fast, plain) is None


@pytest.mark.parametrize("window", [None, 124], ids=["full", "window"])
def test_bfloat16_tokenswift_equals_bfloat16_plain_with_the_defaults(window: int | None) -> None:
    """bfloat16 is lossless too, through the batch-invariant verification (exact_attention.py)."""
    from tokenswift_cli.config import ContextWindow
    from tokenswift_cli.model.heads import load_heads, shipped_heads
    from tokenswift_cli.runs.run_model import with_scripts_filter
    from tokenswift_cli.sampling.defaults import EMBEDDED

    loaded = load_model(ModelSpec(dtype="bfloat16"))
    target = Target(loaded.model)
    shipped = shipped_heads("default")
    assert shipped is not None
    heads = load_heads(shipped, loaded.model.config, fingerprint=loaded.fingerprint).to(torch.bfloat16)
    prompt = loaded.tokenizer(PROMPT.read_text())["input_ids"]
    context = ContextWindow(size=window) if window else None
    sampling = with_scripts_filter(
        EMBEDDED, loaded.tokenizer, loaded.model.config.vocab_size, prefix=PROMPT.read_text()
    )
    cfg = RunConfig(max_new_tokens=200, sampling=sampling, window=context, draft=DraftConfig().drafting("auto"))
    plain, _ = generate_tokens(target, None, prompt, cfg.replace(mode="plain"))
    fast, _ = generate_tokens(target, heads, prompt, cfg)
    assert first_divergence(fast, plain) is None


def test_write_with_every_default_equals_plain_mode() -> None:
    """`tokenswift write` as users run it (4-bit weights, the measured sampling, the scripts filter, DRY)."""
    from cli_helpers import cli

    texts = {}
    for mode in ("tokenswift", "plain"):
        result = cli("write", "--prefix", PROMPT, "--tokens", 96, "--mode", mode, "-q", "--threads", 1)
        assert result.exit_code == 0, result.output
        texts[mode] = result.stdout
    settings = sorted(Path(os.environ["TOKENSWIFT_HOME"], "runs").glob("run-*/settings.json"))[-1]
    recorded = json.loads(settings.read_text())
    assert recorded["model"]["spec"]["weights"] == "int4" and recorded["run_config"]["sampling"]["scripts"] == ["latin"]
    assert recorded["run_config"]["kv_cache"] == "float16"  # "auto" where the C++ decoder reads it
    assert texts["tokenswift"] == texts["plain"] and len(texts["plain"]) > 200


def test_an_8bit_cache_run_stopped_and_resumed_writes_the_uninterrupted_text() -> None:
    """`--kv-cache int8` through checkpoints: the rows and their scales saved, restored, recorded as int8."""
    from cli_helpers import cli

    common = ("--prefix", PROMPT, "--kv-cache", "int8", "--checkpoint-every", 16, "-q", "--threads", 1)
    whole = cli("write", *common, "--tokens", 80)
    assert whole.exit_code == 0, whole.output
    first = cli("write", *common, "--tokens", 40)
    assert first.exit_code == 0, first.output
    run = sorted(Path(os.environ["TOKENSWIFT_HOME"], "runs").glob("run-*"))[-1]
    assert json.loads((run / "checkpoint" / "manifest.json").read_text())["kv"]["dtype"] == "int8"
    resumed = cli("resume", run.name, "--tokens", 80, "-q", "--threads", 1)
    assert resumed.exit_code == 0, resumed.output
    assert first.stdout + resumed.stdout == whole.stdout and len(whole.stdout) > 150


def test_an_8bit_cache_run_from_before_the_integer_products_says_so_when_resumed() -> None:
    from cli_helpers import cli

    from tokenswift_cli.model import kv_rows

    first = cli("write", "--prefix", PROMPT, "--kv-cache", "int8", "--checkpoint-every", 16, "-q", "--threads", 1,
                "--tokens", 24)  # fmt: skip
    assert first.exit_code == 0, first.output
    run = sorted(Path(os.environ["TOKENSWIFT_HOME"], "runs").glob("run-*"))[-1]
    settings = json.loads((run / "settings.json").read_text())
    assert settings["model"]["kv_arithmetic"] == kv_rows.ARITHMETIC
    del settings["model"]["kv_arithmetic"]  # as runs written until 2026-11-28 are
    (run / "settings.json").write_text(json.dumps(settings))
    resumed = cli("resume", run.name, "--tokens", 40, "--threads", 1)
    assert resumed.exit_code == 0, resumed.output
    assert f"8-bit KV cache read by {kv_rows.EARLIER}, resumes with {kv_rows.ARITHMETIC}" in resumed.stderr
    settings["model"]["kv_arithmetic"] = kv_rows.ARITHMETIC
    (run / "settings.json").write_text(json.dumps(settings))
    again = cli("resume", run.name, "--tokens", 56, "--threads", 1)  # the arithmetic it records: nothing to say
    assert again.exit_code == 0 and "8-bit KV cache read by" not in again.stderr


@pytest.mark.parametrize("kv_cache", ["float16", "int8"])
def test_4bit_layers_in_cpp_and_in_python_write_the_same_text(kv_cache: str) -> None:
    """The users' path (4-bit weights, the C++ decoder layers) against the Python layers, on the real model,
    with the cache in float16 ("auto") or in 8 bits (`--kv-cache int8`); drafts from the partial cache."""
    from tokenswift_cli.config import ContextWindow
    from tokenswift_cli.model.heads import load_heads, shipped_heads
    from tokenswift_cli.runs.run_model import with_scripts_filter
    from tokenswift_cli.sampling.defaults import EMBEDDED

    loaded = load_model(ModelSpec(weights="int4"))
    target = Target(loaded.model)
    native = target.native
    assert native is not None
    shipped = shipped_heads("default")
    assert shipped is not None
    heads = load_heads(shipped, loaded.model.config, fingerprint=loaded.fingerprint)
    prompt = loaded.tokenizer(PROMPT.read_text())["input_ids"]
    sampling = with_scripts_filter(
        EMBEDDED, loaded.tokenizer, loaded.model.config.vocab_size, prefix=PROMPT.read_text()
    )
    # the same storage for the Python layers as for the C++ ones
    cfg = RunConfig(max_new_tokens=160, sampling=sampling, window=ContextWindow(size=124), kv_cache=kv_cache)  # type: ignore[arg-type]
    fast, _ = generate_tokens(target, heads, prompt, cfg.replace(draft=DraftConfig().drafting("pass")))
    plain, _ = generate_tokens(target, None, prompt, cfg.replace(mode="plain"))
    target.backend.native = None
    python_layers, _ = generate_tokens(target, None, prompt, cfg.replace(mode="plain"))
    assert first_divergence(fast, plain) is None and first_divergence(python_layers, plain) is None


def test_the_spacing_word_capitals_and_whitespace_rules_on_the_embedded_model_hold_losslessly() -> None:
    """`--spacing`, `--max-word`, `--max-capitalised` and `--max-spaces` with the real byte-level vocabulary:
    TokenSwift writes plain decoding's text, with no glued pair, no word past the cap, no more capitalised
    words and no more whitespace in a row (one: no blank line)."""
    import dataclasses
    import re

    from tokenswift_cli.model.heads import load_heads, shipped_heads
    from tokenswift_cli.runs.run_model import with_scripts_filter
    from tokenswift_cli.sampling.defaults import EMBEDDED

    loaded = load_model(ModelSpec(weights="int4"))
    target, vocab = Target(loaded.model), loaded.model.config.vocab_size
    shipped = shipped_heads("default")
    assert shipped is not None
    heads = load_heads(shipped, loaded.model.config, fingerprint=loaded.fingerprint)
    prompt = loaded.tokenizer(PROMPT.read_text())["input_ids"]
    spaced = dataclasses.replace(EMBEDDED, spacing=True, max_word=8, max_capitalised=2, max_spaces=1)
    sampling = with_scripts_filter(spaced, loaded.tokenizer, vocab, prefix=PROMPT.read_text())
    rule = sampling.spacing_rule
    assert rule is not None
    comma, the, spaced_the = (loaded.tokenizer(w, add_special_tokens=False)["input_ids"] for w in (",", "the", " the"))
    assert rule.banned(comma)[the[0]] and not rule.banned(comma)[spaced_the[0]]
    cfg = RunConfig(max_new_tokens=160, sampling=sampling, kv_cache="float16")
    plain, _ = generate_tokens(target, None, prompt, cfg.replace(mode="plain"))
    fast, _ = generate_tokens(target, heads, prompt, cfg)
    assert first_divergence(fast, plain) is None
    text = loaded.tokenizer.decode([prompt[-1], *plain])
    assert not re.search(r"[,;!?][^\W\d_]|[a-z][A-Z]", text), text
    assert not re.search(r"[^\s\u0800-\U0010ffff]{9}", loaded.tokenizer.decode(plain)), text
    before = in_a_row(PROMPT.read_text())
    assert max(in_a_row(PROMPT.read_text() + loaded.tokenizer.decode(plain))[len(before) :]) <= max(2, before[-1])
    assert longest_run(loaded.tokenizer.decode(plain)) == 1
