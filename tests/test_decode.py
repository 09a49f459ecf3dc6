"""Lossless is the contract: TokenSwift == plain decoding == transformers' generate, token for token."""

from __future__ import annotations

import pytest
import torch
from helpers import first_divergence, random_heads, random_prompt, tiny_target

from tokenswift_cli.config import DraftConfig, RunConfig, SamplingConfig
from tokenswift_cli.engine.decode import generate, generate_tokens
from tokenswift_cli.engine.state import prefill

TOKENS = 320
SMALL_PARTIAL = DraftConfig(partial_budget=64, sink_tokens=4, recent_window=16)


def hf_greedy(target, prompt: list[int], tokens: int) -> list[int]:  # type: ignore[no-untyped-def]
    model = target.model
    model.set_attn_implementation("sdpa")
    try:
        out = model.generate(torch.tensor([prompt]), max_new_tokens=tokens, do_sample=False)
    finally:
        model.set_attn_implementation("tokenswift")
    return out[0, len(prompt) :].tolist()


@pytest.mark.parametrize("prefix", [24, 150], ids=["prefix<budget", "prefix>budget"])
def test_greedy_matches_plain_and_generate(family: str, prefix: int) -> None:
    target = tiny_target(family)
    heads = random_heads(target)
    prompt = random_prompt(prefix)
    reference = hf_greedy(target, prompt, TOKENS)
    plain, _ = generate_tokens(target, None, prompt, RunConfig(max_new_tokens=TOKENS, mode="plain"))
    fast, stats = generate_tokens(target, heads, prompt, RunConfig(max_new_tokens=TOKENS, draft=SMALL_PARTIAL))
    assert first_divergence(plain, reference) is None
    assert first_divergence(fast, plain) is None
    assert stats.iterations < TOKENS  # drafts were accepted: the test exercises multi-token commits


@pytest.mark.parametrize(
    "draft",
    [
        DraftConfig(tree=(1,), ngram_top_k=None, partial_budget=None),
        DraftConfig(tree=(2, 2), ngram_top_k=None, partial_budget=64, sink_tokens=4, recent_window=16),
        DraftConfig(tree=(1, 3, 3, 3), ngram_top_k=8, partial_budget=48, sink_tokens=0, recent_window=8),
        DraftConfig(tree=(3, 1, 1, 1), ngram_top_k=2, ngram_size=3, partial_budget=None),
        DraftConfig(tree=(4,), ngram_top_k=4, partial_budget=64, sink_tokens=4, recent_window=16),
    ],
    ids=["chain1", "2x2", "1333-ngram8", "3111-trigram", "no-heads-shape"],
)
@pytest.mark.parametrize("with_heads", [True, False], ids=["heads", "no-heads"])
def test_every_tree_shape_is_lossless(draft: DraftConfig, with_heads: bool) -> None:
    target = tiny_target("llama-gqa", seed=3)
    heads = random_heads(target) if with_heads else None
    prompt = random_prompt(90, seed=4)
    plain, _ = generate_tokens(target, None, prompt, RunConfig(max_new_tokens=200, mode="plain"))
    fast, _ = generate_tokens(target, heads, prompt, RunConfig(max_new_tokens=200, draft=draft))
    assert first_divergence(fast, plain) is None


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_seeded_sampling_matches_plain(family: str, seed: int) -> None:
    sampling = SamplingConfig(temperature=1.0, min_p=0.1, penalty=1.2, penalty_window=64, seed=seed)
    target = tiny_target(family)
    heads = random_heads(target)
    prompt = random_prompt(100, seed=seed + 10)
    plain, _ = generate_tokens(target, None, prompt, RunConfig(max_new_tokens=250, mode="plain", sampling=sampling))
    fast, stats = generate_tokens(
        target, heads, prompt, RunConfig(max_new_tokens=250, sampling=sampling, draft=SMALL_PARTIAL)
    )
    assert first_divergence(fast, plain) is None
    assert stats.accepted > 0


def test_other_filters_match_plain() -> None:
    sampling = SamplingConfig(temperature=0.7, top_k=20, top_p=0.9, eta=0.02, penalty=1.3, penalty_window=16, seed=9)
    target = tiny_target("qwen2", seed=5)
    prompt = random_prompt(60, seed=6)
    plain, _ = generate_tokens(target, None, prompt, RunConfig(max_new_tokens=200, mode="plain", sampling=sampling))
    fast, _ = generate_tokens(target, random_heads(target), prompt, RunConfig(max_new_tokens=200, sampling=sampling))
    assert first_divergence(fast, plain) is None


def test_different_seeds_give_different_text() -> None:
    target = tiny_target("llama-mha")
    prompt = random_prompt(30)
    configs = [RunConfig(max_new_tokens=40, sampling=SamplingConfig(temperature=1, seed=s)) for s in (1, 2)]
    runs = [generate_tokens(target, None, prompt, cfg)[0] for cfg in configs]
    assert runs[0] != runs[1]


def test_budget_is_exact_and_events_stream_the_text() -> None:
    target = tiny_target("llama-gqa")
    prompt = random_prompt(40)
    cfg = RunConfig(max_new_tokens=77, draft=SMALL_PARTIAL)
    state = prefill(target, prompt, cfg)
    streamed = [t for event in generate(target, random_heads(target), state, cfg) for t in event.tokens]
    assert len(streamed) == 77
    assert streamed == state.generated[:77]


def test_stop_at_eos_stops_in_both_modes() -> None:
    target = tiny_target("llama-mha")
    prompt = random_prompt(30)
    sampling = SamplingConfig(temperature=1.0, seed=4)
    plain, _ = generate_tokens(target, None, prompt, RunConfig(max_new_tokens=400, mode="plain", sampling=sampling))
    eos = plain[50]  # pretend the 51st token is end-of-sequence
    cut = plain[: plain.index(eos) + 1]
    for mode in ("plain", "tokenswift"):
        cfg = RunConfig(max_new_tokens=400, mode=mode, sampling=sampling, stop_at_eos=True)
        out, _ = generate_tokens(target, random_heads(target), prompt, cfg, eos_ids=[eos])
        assert out == cut


def test_mistral_is_lossless_too() -> None:
    target = tiny_target("mistral", seed=2)
    prompt = random_prompt(100, seed=3)
    reference = hf_greedy(target, prompt, 200)
    sampling = SamplingConfig(temperature=1.0, min_p=0.05, penalty=1.2, penalty_window=32, seed=1)
    fast, _ = generate_tokens(target, random_heads(target), prompt, RunConfig(max_new_tokens=200, draft=SMALL_PARTIAL))
    assert first_divergence(fast, reference) is None
    plain, _ = generate_tokens(target, None, prompt, RunConfig(max_new_tokens=200, mode="plain", sampling=sampling))
    fast, _ = generate_tokens(target, random_heads(target), prompt, RunConfig(max_new_tokens=200, sampling=sampling))
    assert first_divergence(fast, plain) is None


def test_split_kv_over_threads_is_lossless(monkeypatch: pytest.MonkeyPatch) -> None:
    """A cache cut into chunks for several threads (attention.py) gives the same text as generate()."""
    from tokenswift_cli.model import attention

    monkeypatch.setattr(attention, "SPLIT_KV_MIN", 32)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        target = tiny_target("llama-gqa")
        prompt = random_prompt(100)
        reference = hf_greedy(target, prompt, 160)
        plain, _ = generate_tokens(target, None, prompt, RunConfig(max_new_tokens=160, mode="plain"))
        fast, _ = generate_tokens(target, random_heads(target), prompt, RunConfig(max_new_tokens=160))
    finally:
        torch.set_num_threads(threads)
    assert first_divergence(plain, reference) is None
    assert first_divergence(fast, plain) is None


def test_the_draft_pass_on_the_partial_cache_sits_at_the_texts_position() -> None:
    """The partial cache holds fewer positions than the text: the root must still be rotated at n."""
    from tokenswift_cli.engine.drafters.base import DraftModel
    from tokenswift_cli.engine.drafters.draft_pass import PassDrafter

    target = tiny_target("llama-gqa")
    cfg = RunConfig(max_new_tokens=8, draft=SMALL_PARTIAL)
    state = prefill(target, random_prompt(150), cfg)
    assert state.draft_cache() is state.partial and state.partial.length < len(state.tokens)
    seen: list[list[int]] = []
    hook = target.decoder.rotary_emb.register_forward_hook(lambda m, args, out: seen.append(args[1][0].tolist()))
    try:
        PassDrafter(SMALL_PARTIAL, DraftModel(target, random_heads(target), cfg.sampling)).propose(state)
    finally:
        hook.remove()
    assert seen == [[len(state.tokens)]]


def test_dry_penalises_the_token_that_extends_a_repeat() -> None:
    from tokenswift_cli.sampling.distribution import dry_penalties

    cfg = SamplingConfig(temperature=1.0, dry_multiplier=0.8, dry_base=2.0, dry_allowed_length=2)
    penalties = dry_penalties(torch.tensor([1, 2, 3, 4, 9, 1, 2, 3]), 10, cfg)  # "1 2 3" again: 4 would repeat it
    expected = torch.zeros(10)
    expected[4] = 0.8 * 2.0 ** (3 - 2)
    assert torch.equal(penalties, expected)
    assert dry_penalties(torch.tensor([1, 2, 3, 4, 9, 7, 2, 3]), 10, cfg)[4] == 0.8  # "2 3": base^0
    assert not dry_penalties(torch.tensor([5, 3, 4, 9, 7, 2, 3]), 10, cfg).any()  # "3" alone: shorter than 2


@pytest.mark.parametrize("greedy", [True, False])
def test_tokenswift_equals_plain_with_dry(greedy: bool) -> None:
    target = tiny_target("llama-gqa")
    heads, prompt = random_heads(target), random_prompt(150)
    sampling = SamplingConfig(temperature=0.0 if greedy else 1.0, min_p=0.05, dry_multiplier=0.8, dry_range=96, seed=4)
    cfg = RunConfig(max_new_tokens=TOKENS, sampling=sampling, draft=SMALL_PARTIAL)
    plain, _ = generate_tokens(target, None, prompt, cfg.replace(mode="plain"))
    fast, stats = generate_tokens(target, heads, prompt, cfg)
    undry, _ = generate_tokens(target, None, prompt, cfg.replace(mode="plain", sampling=SamplingConfig(
        temperature=sampling.temperature, min_p=0.05, seed=4)))  # fmt: skip
    assert first_divergence(fast, plain) is None
    assert stats.iterations < TOKENS and plain != undry


def test_xtc_drops_the_top_choices_but_the_least_likely_at_the_positions_its_coin_picks() -> None:
    from tokenswift_cli.sampling.distribution import exclude_top_choices, position_uniform

    cfg = SamplingConfig(temperature=1.0, xtc_probability=0.5, xtc_threshold=0.1, seed=3)
    scores = torch.log(torch.tensor([0.5, 0.25, 0.15, 0.06, 0.04]))
    picked = [p for p in range(40) if position_uniform(3, p, salt="xtc") < 0.5]
    assert 5 < len(picked) < 35 and position_uniform(3, 0, salt="xtc") != position_uniform(3, 0)
    for position in range(40):
        out = exclude_top_choices(scores, position, cfg)
        if position in picked:  # 0.5 and 0.25 go; 0.15, the least likely above 0.1, stays with the rest
            assert torch.isinf(out[:2]).all() and torch.equal(out[2:], scores[2:])
        else:
            assert torch.equal(out, scores)
    one_top = torch.log(torch.tensor([0.9, 0.05, 0.05]))  # a single top choice: nothing to exclude
    assert torch.equal(exclude_top_choices(one_top, picked[0], cfg), one_top)


@pytest.mark.parametrize("family", ["llama-gqa", "qwen2"])
def test_tokenswift_equals_plain_with_xtc(family: str) -> None:
    target = tiny_target(family)
    heads, prompt = random_heads(target), random_prompt(150)
    sampling = SamplingConfig(temperature=1.0, min_p=0.02, xtc_probability=0.5, xtc_threshold=0.05, seed=4)
    cfg = RunConfig(max_new_tokens=TOKENS, sampling=sampling, draft=SMALL_PARTIAL)
    plain, _ = generate_tokens(target, None, prompt, cfg.replace(mode="plain"))
    fast, stats = generate_tokens(target, heads, prompt, cfg)
    without, _ = generate_tokens(target, None, prompt, cfg.replace(mode="plain", sampling=SamplingConfig(
        temperature=1.0, min_p=0.02, seed=4)))  # fmt: skip
    assert first_divergence(fast, plain) is None
    assert stats.iterations < TOKENS and plain != without
