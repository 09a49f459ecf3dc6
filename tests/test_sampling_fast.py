"""The sampler's fast paths against the implementation they replace: same scores, bit for bit, and same tokens."""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
import sys

import pytest
import torch
from transformers import MinPLogitsWarper, RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper

from tokenswift_cli.config import SamplingConfig
from tokenswift_cli.sampling import distribution as sampling
from tokenswift_cli.sampling.distribution import choose, position_uniform, target_scores

INF = float("inf")


def reference_scores(logits: torch.Tensor, context: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """`target_scores` as it was: every processor through `LogitsProcessorList` on `[1, vocab]` (no DRY, scripts)."""
    scores = logits.float()[None].clone()
    if cfg.suppress_token_ids:
        scores[0, list(cfg.suppress_token_ids)] = -INF
    window = context[-cfg.penalty_window :]
    return sampling._processors(cfg)(window[None], scores)[0]


def reference_choose(logits: torch.Tensor, context: torch.Tensor, position: int, cfg: SamplingConfig) -> int:
    """`choose` as it was: the inverse CDF over the whole vocabulary."""
    scores = reference_scores(logits, context, cfg)
    if cfg.greedy:
        return int(scores.argmax())
    cdf = torch.softmax(scores.double(), dim=-1).cumsum(0)
    u = position_uniform(cfg.seed, position) * float(cdf[-1])
    token = int(torch.searchsorted(cdf, torch.tensor([u], dtype=cdf.dtype)))
    return min(token, cdf.shape[0] - 1)


def random_logits(rng: random.Random, vocab: int) -> torch.Tensor:
    """Negative and positive logits, some of them tied, a few -inf."""
    logits = torch.randn(vocab) * rng.choice([1.0, 3.0, 8.0]) + rng.uniform(-5, 5)
    ties = torch.randint(0, vocab, (vocab // 10,))
    logits[ties] = float(logits[rng.randrange(vocab)])
    if rng.random() < 0.3:
        logits[torch.randint(0, vocab, (rng.randint(1, 5),))] = -INF
    return logits


def random_config(rng: random.Random, vocab: int) -> SamplingConfig:
    return SamplingConfig(
        temperature=rng.choice([0.0, 1.0, 1.0, 0.7, 1.3]),
        min_p=rng.choice([None, 0.1, 0.1, 0.05, 0.3]),
        penalty=rng.choice([None, 1.2, 1.2, 1.1, 0.8]),
        penalty_window=rng.choice([4, 64, 1024]),
        suppress_token_ids=tuple(rng.sample(range(vocab), rng.choice([0, 0, 1, 3]))),
        seed=rng.randrange(1000),
    )


def random_context(rng: random.Random, vocab: int) -> torch.Tensor:
    """Token ids, many repeated (a few distinct ones in a long window)."""
    return torch.randint(0, rng.choice([8, vocab]), (rng.randint(0, 1500),))


def test_fast_processors_are_bit_identical_to_transformers() -> None:
    rng = random.Random(0)
    torch.manual_seed(0)
    for _ in range(400):
        vocab = rng.choice([50, 1000, 49152])
        scores, window = random_logits(rng, vocab), random_context(rng, vocab)
        penalty = RepetitionPenaltyLogitsProcessor(rng.choice([1.2, 1.1, 0.8, 2.0]))
        temperature = TemperatureLogitsWarper(rng.choice([0.7, 1.3, 0.3]))
        min_p = MinPLogitsWarper(rng.choice([0.1, 0.05, 0.3, 0.9]))
        for processor, fast in [
            (penalty, sampling._penalise),
            (temperature, sampling._divide),
            (min_p, sampling._cut_min_p),
        ]:
            expected = processor(window[None], scores[None].clone())[0]  # type: ignore[operator]
            assert torch.equal(fast(processor, window, scores.clone()), expected)  # type: ignore[operator]


def test_min_p_fast_path_keeps_ties_at_the_threshold() -> None:
    """Tokens whose probability equals min_p * top exactly are kept by both."""
    torch.manual_seed(1)
    exact = 0
    for _ in range(200):
        scores = torch.randn(1000) * 2
        scores[torch.randint(0, 1000, (50,))] = float(scores[0])  # 50 ties at one level
        probs = torch.softmax(scores, dim=-1)
        ratio = float(probs[0] / probs.max())
        for candidate in torch.tensor([ratio]).float().nextafter(torch.tensor([-INF, INF])).tolist() + [ratio]:
            warper = MinPLogitsWarper(candidate)
            if bool((candidate * probs.max() == probs).any()):
                exact += 1
            expected = warper(torch.zeros(1, 0, dtype=torch.long), scores[None].clone())[0]
            assert torch.equal(sampling._cut_min_p(warper, torch.zeros(0, dtype=torch.long), scores.clone()), expected)
    assert exact > 50  # the threshold did land on the tied probability


def test_target_scores_are_bit_identical_to_the_processor_list() -> None:
    rng = random.Random(2)
    torch.manual_seed(2)
    extra = [{}, {}, {}, {"top_k": 20}, {"top_p": 0.9}, {"eta": 0.01}]  # the last three: the general path
    for _ in range(300):
        vocab = rng.choice([50, 1000, 49152])
        base = random_config(rng, vocab)
        cfg = dataclasses.replace(base, **rng.choice(extra))
        logits, context = random_logits(rng, vocab), random_context(rng, vocab)
        assert torch.equal(target_scores(logits, context, cfg), reference_scores(logits, context, cfg))


@pytest.mark.parametrize("vocab", [50, 1000, 49152])
def test_choose_draws_the_tokens_it_drew_before(vocab: int) -> None:
    rng = random.Random(vocab)
    torch.manual_seed(vocab)
    for _ in range(300):
        cfg = random_config(rng, vocab)
        logits, context = random_logits(rng, vocab), random_context(rng, vocab)
        for position in rng.sample(range(10**6), 5):
            assert choose(logits, context, position, cfg) == reference_choose(logits, context, position, cfg)


def test_the_searched_cdf_is_within_the_rounding_allowance_of_the_full_one() -> None:
    """The premise of `_draw_kept`'s check: its CDF (as it computes it) stays well within its allowance."""
    torch.manual_seed(3)
    worst = 0.0
    for _ in range(300):
        scores = torch.randn(49152) * 3
        scores[torch.rand(49152) > 0.01] = -INF
        kept = torch.nonzero(scores != -INF).flatten()
        full = torch.softmax(scores.double(), dim=-1).cumsum(0)[kept].tolist()
        values = scores[kept].tolist()
        weights = [math.exp(value - max(values)) for value in values]
        searched = list(itertools.accumulate(weight * (1.0 / sum(weights)) for weight in weights))
        allowance = 8 * (len(values) + 2) * sys.float_info.epsilon * searched[-1]
        worst = max(worst, max(abs(a - b) for a, b in zip(full, searched, strict=True)) / allowance)
    assert worst < 0.1


def test_a_draw_on_a_cdf_step_is_left_to_the_full_cdf() -> None:
    assert sampling._draw_kept([3, 8], [0.0, 0.0], 0.5) is None  # the target sits on the first step
    assert sampling._draw_kept([3, 8], [0.0, 0.0], 0.4) == 3
    assert sampling._draw_kept([3, 8], [0.0, 0.0], 0.6) == 8


def test_choose_falls_back_to_the_full_cdf_on_nan_or_no_finite_score() -> None:
    logits, context = torch.tensor([1.0, 2.0, float("nan"), 0.5]), torch.tensor([0])
    cfg = SamplingConfig(temperature=1.0, seed=4)
    for position in range(20):
        assert choose(logits, context, position, cfg) == reference_choose(logits, context, position, cfg)
    every = SamplingConfig(temperature=1.0, suppress_token_ids=(0, 1, 2, 3))
    assert choose(logits, context, 7, every) == reference_choose(logits, context, 7, every)


def test_the_full_cdf_draw_keeps_its_tokens_with_its_target_made_on_the_device() -> None:
    """`_draw_full` forms u * total as a tensor beside the CDF (no CPU tensor against a GPU CDF): same tokens."""
    torch.manual_seed(5)
    for _ in range(200):
        scores = torch.randn(3000) * 4
        u = float(torch.rand(()))
        cdf = torch.softmax(scores.double(), dim=-1).cumsum(0)
        before = min(int(torch.searchsorted(cdf, torch.tensor([u * float(cdf[-1])], dtype=cdf.dtype))), 2999)
        assert sampling._draw_full(scores, u) == before
