"""YaRN context extension: resolution of the choice, exactness of factor 1, losslessness through the engine."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from conftest import tiny_model
from helpers import first_divergence, random_heads, random_prompt
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from tokenswift_cli.config import ConfigError, DraftConfig, ModelSpec, RunConfig, SamplingConfig
from tokenswift_cli.engine.decode import generate_tokens
from tokenswift_cli.model.loading import eos_token_ids, load_model
from tokenswift_cli.model.rope import RopePlan, apply_rope, plan_rope, rotary_frequencies, yarn_factor
from tokenswift_cli.model.target import Target

TRAINED = 128  # a short trained length, so that a test run outgrows it cheaply


def short_llama(seed: int = 3):  # type: ignore[no-untyped-def]
    model = tiny_model("llama-gqa", seed)
    model.config.max_position_embeddings = TRAINED  # default rope: only yarn reads this
    return model


def logits(model, tokens: list[int]) -> torch.Tensor:  # type: ignore[no-untyped-def]
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0]


def test_factor_is_sized_to_the_run_in_half_steps() -> None:
    assert yarn_factor(100, 128) == 1.0
    assert yarn_factor(128, 128) == 1.0
    assert yarn_factor(129, 128) == 1.5
    assert yarn_factor(8192 + 32768, 8192) == 5.0
    assert yarn_factor(100_000 + 200, 8192) == 12.5


def test_auto_scales_only_past_the_trained_length() -> None:
    config = short_llama().config
    assert plan_rope(ModelSpec(), config, 100).scaling == "none"
    assert plan_rope(ModelSpec(), config, None).scaling == "none"
    plan = plan_rope(ModelSpec(), config, 300)
    assert (plan.scaling, plan.factor, plan.trained_length, plan.supported_length) == ("yarn", 2.5, TRAINED, 320)
    assert plan.warning() is None
    assert plan_rope(ModelSpec(rope_factor=4), config, 300).factor == 4.0


def test_explicit_choices_and_their_resolved_spec() -> None:
    config = short_llama().config
    none = plan_rope(ModelSpec(rope_scaling="none"), config, 300)
    assert none.scaling == "none" and none.resolved(ModelSpec()) == ModelSpec(rope_scaling="none")
    yarn = plan_rope(ModelSpec(rope_scaling="yarn"), config, 100)
    assert (yarn.scaling, yarn.factor) == ("yarn", 1.0)
    fixed = plan_rope(ModelSpec(rope_scaling="yarn", rope_factor=3), config, None)
    assert fixed.resolved(ModelSpec()) == ModelSpec(rope_scaling="yarn", rope_factor=3.0)
    with pytest.raises(ValueError, match="needs a factor"):
        plan_rope(ModelSpec(rope_scaling="yarn"), config, None)


def test_warning_when_the_run_goes_past_what_the_model_supports() -> None:
    config = short_llama().config
    warning = plan_rope(ModelSpec(rope_scaling="none"), config, 300).warning()
    assert warning is not None and "300" in warning and str(TRAINED) in warning and "\n" not in warning
    assert "YaRN factor 2" in str(plan_rope(ModelSpec(rope_factor=2), config, 300).warning())
    assert plan_rope(ModelSpec(rope_factor=3), config, 300).warning() is None


def test_model_with_its_own_scaling_is_kept_by_auto() -> None:
    config = short_llama().config
    config.rope_parameters = {**config.rope_parameters, "rope_type": "yarn", "factor": 4.0,
                              "original_max_position_embeddings": 64}  # fmt: skip
    plan = plan_rope(ModelSpec(), config, 300)
    assert (plan.scaling, plan.trained_length) == ("none", 64)


@pytest.mark.parametrize(
    ("changes", "message"),
    [({"rope_scaling": "ntk"}, "unknown rope scaling"), ({"rope_factor": 0.5}, ">= 1"),
     ({"rope_factor": math.inf}, ">= 1"), ({"rope_scaling": "none", "rope_factor": 2.0}, "needs rope scaling")],
)  # fmt: skip
def test_spec_validation(changes: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ModelSpec(**changes)  # type: ignore[arg-type]


def test_factor_one_and_none_leave_logits_unchanged() -> None:
    tokens = random_prompt(200, seed=2)
    reference = logits(short_llama(), tokens)
    for spec in (ModelSpec(rope_scaling="yarn", rope_factor=1.0), ModelSpec(rope_scaling="none")):
        model = short_llama()
        apply_rope(model, plan_rope(spec, model.config, 200))
        assert torch.equal(logits(model, tokens), reference)


def test_yarn_interpolates_low_frequencies_and_scales_attention() -> None:
    model = short_llama()
    before, _ = rotary_frequencies(model)
    apply_rope(model, RopePlan("yarn", 4.0, TRAINED, TRAINED))
    after, scaling = rotary_frequencies(model)
    assert scaling == pytest.approx(0.1 * math.log(4.0) + 1.0)
    assert after[0] == before[0]  # the fastest rotation is kept (extrapolated)
    assert after[-1] == pytest.approx(before[-1] / 4.0)  # the slowest one is interpolated
    assert model.config.rope_parameters["rope_type"] == "yarn"
    assert model.config.max_position_embeddings == 4 * TRAINED


@pytest.mark.parametrize("sampling", [SamplingConfig(), SamplingConfig(temperature=1.0, min_p=0.1, penalty=1.2,
                                                                        penalty_window=64, seed=1)],
                         ids=["greedy", "sampled"])  # fmt: skip
def test_yarn_model_runs_losslessly_through_the_engine(sampling: SamplingConfig) -> None:
    model = short_llama()
    prompt = random_prompt(40, seed=5)
    apply_rope(model, plan_rope(ModelSpec(), model.config, len(prompt) + 100))
    target = Target(model)
    draft = DraftConfig(partial_budget=64, sink_tokens=4, recent_window=16)
    plain, _ = generate_tokens(target, None, prompt, RunConfig(max_new_tokens=100, mode="plain", sampling=sampling))
    fast, stats = generate_tokens(
        target, random_heads(target), prompt, RunConfig(max_new_tokens=100, sampling=sampling, draft=draft)
    )
    assert first_divergence(fast, plain) is None
    assert stats.accepted > 0
    if sampling.greedy:  # and the engine's forward is the model's own, scaled one
        model.set_attn_implementation("sdpa")
        reference = model.generate(torch.tensor([prompt]), max_new_tokens=100, do_sample=False)
        assert first_divergence(plain, reference[0, len(prompt) :].tolist()) is None


def save_llama(folder: Path) -> Path:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=TRAINED,
                         eos_token_id=3)  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(folder)
    vocab = {"<unk>": 0, "<|endoftext|>": 1, "hello": 2, "<|im_end|>": 3, "world": 4}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", eos_token="<|im_end|>").save_pretrained(folder)
    return folder


def test_load_model_records_the_resolved_spec_and_reloads_the_same_model(tmp_path: Path) -> None:
    folder = save_llama(tmp_path / "m")
    loaded = load_model(ModelSpec(name=str(folder)), total_tokens=1000)
    assert loaded.spec == ModelSpec(name=str(folder), rope_scaling="yarn", rope_factor=8.0, weights="dense")
    assert loaded.rope is not None and loaded.rope.warning() is None
    again = load_model(loaded.spec)  # resume: no run length needed
    assert torch.equal(rotary_frequencies(again.model)[0], rotary_frequencies(loaded.model)[0])
    plain = load_model(ModelSpec(name=str(folder)))
    assert plain.spec == ModelSpec(name=str(folder), rope_scaling="none", weights="dense")
    assert not torch.equal(rotary_frequencies(plain.model)[0], rotary_frequencies(loaded.model)[0])


def test_eos_token_ids_gathers_config_tokenizer_and_known_markers(tmp_path: Path) -> None:
    loaded = load_model(ModelSpec(name=str(save_llama(tmp_path / "m"))))
    assert eos_token_ids(loaded.tokenizer, loaded.model) == [1, 3]
    assert eos_token_ids(None, loaded.model.config) == [3]
