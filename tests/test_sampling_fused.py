"""The fused kernel (sampling/fused.py, csrc/scores.cpp) against the torch definition: the same scores, bit for
bit, and the same tokens, rule by rule and all together; the cases it hands back are finished by the torch code."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest
import torch

from tokenswift_cli.backends.cpu import kernels
from tokenswift_cli.config import SamplingConfig
from tokenswift_cli.sampling import distribution, fused
from tokenswift_cli.sampling.capitals import CapitalsRule
from tokenswift_cli.sampling.distribution import choose, reference_scores, target_scores
from tokenswift_cli.sampling.scripts import ScriptFilter
from tokenswift_cli.sampling.spacing import SpacingRule
from tokenswift_cli.sampling.whitespace import WhitespaceRule
from tokenswift_cli.sampling.word_length import WordLengthRule

pytestmark = pytest.mark.skipif(not kernels.available(), reason="no C++ compiler: the torch definition runs")

INF = float("inf")
PIECES = [b" the", b"the", b",", b"!", b"a", b"B", b"\xc3", b"\xa9", "\uff28".encode()[:2], "\uff28".encode()[2:],
          " \u4e2d".encode(), b" Word", b"word", b"?", b" ,x", b"aB", "\u00e9".encode(), b"\xe4\xb8", b"  ",
          b"\n "]  # fmt: skip


Rules = tuple[ScriptFilter, SpacingRule, WordLengthRule, CapitalsRule, WhitespaceRule]


def vocabulary(vocab: int) -> list[bytes]:
    return [PIECES[i % len(PIECES)] + bytes([97 + i % 26]) * (i % 3) for i in range(vocab)]


@pytest.fixture(scope="module")
def rules() -> dict[int, Rules]:
    def built(v: int) -> Rules:
        pieces = vocabulary(v)
        return (
            ScriptFilter(("latin",), pieces, v),
            SpacingRule(pieces, v),
            WordLengthRule(pieces, v, 4),
            CapitalsRule(pieces, v, 2),
            WhitespaceRule(pieces, v, 2),
        )

    return {v: built(v) for v in (50, 1000, 49152)}


def random_logits(rng: random.Random, vocab: int) -> torch.Tensor:
    """Negative and positive logits, some tied, a few -inf."""
    logits = torch.randn(vocab) * rng.choice([1.0, 3.0, 8.0]) + rng.uniform(-5, 5)
    logits[torch.randint(0, vocab, (vocab // 10,))] = float(logits[rng.randrange(vocab)])
    if rng.random() < 0.3:
        logits[torch.randint(0, vocab, (rng.randint(1, 5),))] = -INF
    return logits


def lm_logits(rng: random.Random, vocab: int) -> torch.Tensor:
    """A language model's shape: a bulk of low logits and a few tens far above them."""
    logits = torch.randn(vocab) * 2.5
    logits[torch.randint(0, vocab, (30,))] += torch.rand(30) * 6 + 6
    return logits


def random_context(rng: random.Random, vocab: int) -> torch.Tensor:
    """Token ids with repeats, short and long ones (DRY's matches, the penalty's duplicates)."""
    pool = torch.randint(0, vocab, (rng.choice([3, 8, 40]),))
    context = pool[torch.randint(0, pool.numel(), (rng.randint(0, 5000),))]
    if context.numel() > 200 and rng.random() < 0.5:  # a long repeat: DRY's cap of 64 matched tokens
        span = rng.randint(2, 150)
        context = torch.cat([context, context[-span - rng.randint(0, 50) :][:span]])
    return context


def random_config(rng: random.Random, vocab: int, rules: Rules) -> SamplingConfig:
    dry = rng.random() < 0.6
    cfg = SamplingConfig(
        temperature=rng.choice([0.0, 0.0, 1.0, 0.7, 1.3]),
        min_p=rng.choice([None, 0.1, 0.1, 0.05, 0.3, 0.9]),
        top_k=rng.choice([None, None, None, 1, 20, vocab + 5]),
        top_p=rng.choice([None, None, None, 0.9]),
        eta=rng.choice([None] * 7 + [0.01]),
        penalty=rng.choice([None, 1.1, 1.2, 0.8]),
        penalty_window=rng.choice([1, 4, 64, 1024]),
        dry_multiplier=rng.choice([0.8, 1.5]) if dry else None,
        dry_base=rng.choice([1.2, 1.75, 3.0]),
        dry_allowed_length=rng.choice([1, 2, 4]),
        dry_range=rng.choice([2, 64, 4096]),
        xtc_probability=rng.choice([None, None, 0.5]),
        suppress_token_ids=tuple(rng.sample(range(vocab), rng.choice([0, 1, 3]))),
        seed=rng.randrange(1000),
    )
    script_filter, spacing, words, capitals, spaces = rules
    if rng.random() < 0.5:
        cfg = dataclasses.replace(cfg, scripts=("latin",), script_filter=script_filter)
    if rng.random() < 0.4:
        cfg = dataclasses.replace(cfg, spacing=True, spacing_rule=spacing)
    if rng.random() < 0.4:
        cfg = dataclasses.replace(cfg, max_word=words.cap, word_rule=words)
    if rng.random() < 0.4:
        cfg = dataclasses.replace(cfg, max_capitalised=capitals.cap, capitals_rule=capitals)
    if rng.random() < 0.4:
        cfg = dataclasses.replace(cfg, max_spaces=spaces.cap, spaces_rule=spaces)
    return cfg


class Codes:
    """What the kernel returned, call by call (to see that it ran, and which cases it handed back)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.seen: list[int | None] = []
        run = fused.run

        def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
            result = run(*args, **kwargs)
            self.seen.append(None if result is None else result[1])
            return result

        monkeypatch.setattr(fused, "run", spy)


def reference_choose(logits: torch.Tensor, context: torch.Tensor, position: int, cfg: SamplingConfig) -> int:
    """`choose` with the kernel off: the torch definition's scores and draw."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(fused.FUSED, "0")
        return choose(logits, context, position, cfg)


@pytest.mark.parametrize("vocab", [50, 1000, 49152])
def test_the_scores_are_the_definitions_bit_for_bit(vocab: int, rules, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    rng = random.Random(vocab)
    torch.manual_seed(vocab)
    codes = Codes(monkeypatch)
    for _ in range(250 if vocab < 49152 else 120):
        cfg = random_config(rng, vocab, rules[vocab])
        logits, context = random_logits(rng, vocab), random_context(rng, vocab)
        assert torch.equal(target_scores(logits, context, cfg), reference_scores(logits, context, cfg)), cfg
    assert None not in codes.seen and len(codes.seen) == (250 if vocab < 49152 else 120)  # the kernel scored each


@pytest.mark.parametrize("vocab", [50, 1000, 49152])
def test_the_tokens_are_the_definitions(vocab: int, rules, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    rng = random.Random(vocab + 1)
    torch.manual_seed(vocab + 1)
    codes = Codes(monkeypatch)
    for _ in range(150 if vocab < 49152 else 80):
        cfg = random_config(rng, vocab, rules[vocab])
        logits, context = random_logits(rng, vocab), random_context(rng, vocab)
        for position in rng.sample(range(10**6), 3):
            assert choose(logits, context, position, cfg) == reference_choose(logits, context, position, cfg), cfg
    drawn = [code for code in codes.seen if code is not None and code >= 0]
    assert len(drawn) > len(codes.seen) / 3  # most tokens come from the kernel itself


def test_the_default_sampling_draws_in_the_kernel(rules, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The embedded model's defaults (penalty, DRY, temperature, min-p, scripts): the kernel settles the draw."""
    rng = random.Random(5)
    torch.manual_seed(5)
    script_filter, *_ = rules[49152]
    cfg = SamplingConfig(
        temperature=1.3, min_p=0.1, penalty=1.1, penalty_window=1024, dry_multiplier=1.5, dry_base=1.2,
        scripts=("latin",), script_filter=script_filter, suppress_token_ids=(0, 2),
    )  # fmt: skip
    codes = Codes(monkeypatch)
    for position in range(100):
        logits, context = lm_logits(rng, 49152), random_context(rng, 49152)
        assert choose(logits, context, position, cfg) == reference_choose(logits, context, position, cfg)
    assert sum(code is not None and code >= 0 for code in codes.seen) >= 95


def test_softmax_rounds_within_a_hundredth_of_the_min_p_margin() -> None:
    """The premise of the kernel's min-p: torch's float32 softmax puts p / p_max within 1e-6 (relative) of
    exp(score - max), so a score farther than the kernel's margin (1e-5 nats) from the cut is on the side
    the exact ratio says."""
    torch.manual_seed(6)
    worst = 0.0
    for scale in (1.0, 3.0, 8.0, 20.0):
        for _ in range(20):
            scores = torch.randn(49152) * scale + float(torch.randn(1)) * 10
            scores[torch.rand(49152) < 0.1] = -INF
            probs = torch.softmax(scores, dim=-1)
            d = (scores - scores.max()).double()
            ratio = probs.double() / probs.max().double()
            near = (d > -8) & torch.isfinite(d)  # where min-p's cuts lie (min-p >= 0.0003)
            worst = max(worst, float(((ratio[near] / d[near].exp()) - 1).abs().max()))
    assert worst < 1e-6


def test_a_score_at_min_ps_cut_goes_to_torch(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Scores placed at min-p's cut: the kernel hands them back, and the scores are the definition's."""
    codes = Codes(monkeypatch)
    torch.manual_seed(7)
    for min_p in (0.1, 0.3, 0.05):
        cfg = SamplingConfig(temperature=1.0, min_p=min_p, seed=1)
        for _ in range(20):
            scores = torch.randn(1000) * 2
            scores[torch.randint(0, 1000, (30,))] = float(scores.max()) + math.log(min_p)
            for nudge in (-1e-6, 0.0, 1e-6):
                row = scores.clone()
                row[:5] = float(scores.max()) + math.log(min_p) + nudge
                assert torch.equal(target_scores(row, torch.zeros(0, dtype=torch.long), cfg), reference_scores(
                    row, torch.zeros(0, dtype=torch.long), cfg))  # fmt: skip
                assert choose(row, torch.zeros(0, dtype=torch.long), 3, cfg) == reference_choose(
                    row, torch.zeros(0, dtype=torch.long), 3, cfg)  # fmt: skip
    assert fused.MIN_P_UNSETTLED in codes.seen


@pytest.mark.parametrize("value", [INF, float("nan")])
def test_a_nan_or_infinite_score_is_left_to_torch(value: float, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    codes = Codes(monkeypatch)
    cfg = SamplingConfig(temperature=1.0, min_p=0.1, penalty=1.2)
    logits = torch.randn(1000)
    logits[17] = value
    context = torch.tensor([3, 17, 5])
    assert choose(logits, context, 0, cfg) == reference_choose(logits, context, 0, cfg)
    expected = reference_scores(logits, context, cfg)
    assert torch.equal(target_scores(logits, context, cfg).isnan(), expected.isnan())
    assert codes.seen and all(code is None for code in codes.seen)


def test_greedy_takes_the_first_of_tied_maxima() -> None:
    cfg = SamplingConfig(penalty=1.2)
    logits = torch.zeros(1000)
    logits[[40, 7, 900]] = 2.0
    assert choose(logits, torch.tensor([1, 2]), 0, cfg) == 7 == reference_choose(logits, torch.tensor([1, 2]), 0, cfg)
    assert choose(logits, torch.tensor([7, 2]), 0, cfg) == 40  # the penalty took 7 down


def test_without_the_kernels_the_definition_runs(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(fused, "built", lambda: False)
    assert not fused.usable(torch.zeros(10), torch.zeros(0, dtype=torch.long))
    codes = Codes(monkeypatch)
    cfg = SamplingConfig(temperature=1.0, min_p=0.1)
    assert choose(torch.randn(100), torch.zeros(0, dtype=torch.long), 0, cfg) >= 0
    assert codes.seen == []


def test_a_failed_build_is_asked_once(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Without a compiler `kernels.load` raises at every call (nothing cached): the sampler asks once."""
    calls = []
    monkeypatch.setattr(kernels, "available", lambda: calls.append(1) or False)
    fused.built.cache_clear()
    try:
        for _ in range(3):
            assert choose(torch.randn(100), torch.zeros(0, dtype=torch.long), 0, SamplingConfig(temperature=1.0)) >= 0
    finally:
        fused.built.cache_clear()
    assert calls == [1]


def test_the_plan_is_the_processors_prefix() -> None:
    top_p = SamplingConfig(temperature=0.7, top_k=5, top_p=0.9, min_p=0.1, penalty=1.1)
    plan = distribution._plan(top_p)  # penalty, temperature, top-k in the kernel; top-p, min-p by torch
    assert (plan.rest_at, plan.processors, plan.top_k, plan.min_p) == (3, 5, 5, 0.0)
    paper = distribution._plan(SamplingConfig(temperature=1.0, min_p=0.1, penalty=1.2))
    assert paper.complete and (paper.temperature, paper.min_p, paper.min_p_at) == (0.0, 0.1, 1)
