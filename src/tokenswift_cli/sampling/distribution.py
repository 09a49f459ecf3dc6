"""The target distribution and position-keyed draws (the lossless part of TokenSwift step 4).

Every token is drawn by inverting the target's CDF at a uniform that depends only on the seed and
the token's absolute position. Plain and accelerated decoding therefore pick the same token whenever
their logits agree, and each draw follows the target distribution exactly.
The filters are `transformers`' own logits processors, applied to one node with that node's own
context (its path), so the contextual penalty sees the candidate's ancestors too. `scored` is the
definition, which the device walk runs too; on a CPU `choose` and `target_scores` run the fused kernel
(fused.py), the same bits in one call.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import itertools
import math
import sys
from collections.abc import Callable, Sequence
from typing import Any

import torch
from transformers import (
    EtaLogitsWarper,
    LogitsProcessorList,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from tokenswift_cli.config import ConfigError, SamplingConfig
from tokenswift_cli.sampling import fused
from tokenswift_cli.sampling.capitals import CapitalsRule
from tokenswift_cli.sampling.dry import dry_amounts, dry_penalties
from tokenswift_cli.sampling.scripts import ScriptFilter
from tokenswift_cli.sampling.spacing import SpacingRule
from tokenswift_cli.sampling.whitespace import WhitespaceRule
from tokenswift_cli.sampling.word_length import WordLengthRule


def position_uniform(seed: int, position: int, salt: str = "") -> float:
    """A uniform in (0, 1) that depends only on `seed`, the absolute token `position` (and `salt`, for
    other uses than the draw)."""
    digest = hashlib.blake2b(f"{seed}:{position}{salt and ':' + salt}".encode(), digest_size=8).digest()
    return ((int.from_bytes(digest, "little") >> 11) + 0.5) / 2.0**53


@functools.lru_cache(maxsize=16)
def _processors(cfg: SamplingConfig) -> LogitsProcessorList:
    """Penalty first, then the warpers, in `transformers`' own order."""
    processors = LogitsProcessorList()
    if cfg.penalty is not None and cfg.penalty != 1.0:
        processors.append(RepetitionPenaltyLogitsProcessor(cfg.penalty))
    if cfg.greedy:
        return processors
    if cfg.temperature != 1.0:
        processors.append(TemperatureLogitsWarper(cfg.temperature))
    if cfg.top_k is not None:
        processors.append(TopKLogitsWarper(cfg.top_k))
    if cfg.top_p is not None and cfg.top_p < 1.0:
        processors.append(TopPLogitsWarper(cfg.top_p))
    if cfg.min_p is not None and cfg.min_p > 0:
        processors.append(MinPLogitsWarper(cfg.min_p))
    if cfg.eta is not None:
        processors.append(EtaLogitsWarper(cfg.eta, device="cpu"))
    return processors


def target_scores(logits: torch.Tensor, context: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """Processed scores `[vocab]` for the next token after `context` (the path's last tokens, `[<= W]`):
    by the fused kernel on a CPU, else by their definition (`reference_scores`); the same bits."""
    fast = _fused(logits, context, cfg, fused.SCORES)
    return reference_scores(logits, context, cfg) if fast is None else fast[0]


def reference_scores(logits: torch.Tensor, context: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """`target_scores` by their definition, `scored`: one torch op per rule."""
    device = logits.device
    banned = [rule.banned(context[-last:].tolist()).to(device) for rule, last in filter_rules(cfg)]
    suppress = torch.tensor(cfg.suppress_token_ids, dtype=torch.long, device=device)
    return scored(logits.float(), context.to(device), cfg, suppress=suppress, banned=banned, dry=dry_penalties)


def filter_rules(cfg: SamplingConfig) -> list[tuple[Any, int]]:
    """The filters `cfg` applies, each with how many last tokens its state depends on (a filter asked for
    without its tokenizer: the one-line error)."""
    rules: list[tuple[Any, int]] = []
    if cfg.scripts:
        rules.append((_script_filter(cfg), 4))
    if cfg.spacing:
        rules.append((_spacing_rule(cfg), 1))
    caps = (("word", cfg.max_word, cfg.word_rule), ("capitals", cfg.max_capitalised, cfg.capitals_rule),
            ("whitespace", cfg.max_spaces, cfg.spaces_rule))  # fmt: skip
    for name, cap, rule in caps:
        if cap is not None:
            built = _capped_rule(name, cap, rule)
            rules.append((built, built.context_tokens))
    return rules


def scored(
    row: torch.Tensor, context: torch.Tensor, cfg: SamplingConfig, *, suppress: torch.Tensor,
    banned: Sequence[torch.Tensor], dry: Callable[[torch.Tensor, int, SamplingConfig], torch.Tensor],
) -> torch.Tensor:  # fmt: skip
    """The target's scores from float32 logits `row` `[vocab]` (left as they are) after `context` (on its
    device): `suppress` the suppressed ids, `banned` the filters' masks after `context`, `dry` how DRY's
    penalties are found; then the penalty and the warpers."""
    scores = row.clone()
    if cfg.suppress_token_ids:
        scores.index_fill_(0, suppress, -float("inf"))
    for mask in banned:
        scores.masked_fill_(mask, -float("inf"))
    if cfg.dry_multiplier is not None:
        scores -= dry(context[-cfg.dry_range :], scores.shape[-1], cfg)
    return processed(scores, context[-cfg.penalty_window :], cfg)


def processed(scores: torch.Tensor, window: torch.Tensor, cfg: SamplingConfig, start: int = 0) -> torch.Tensor:
    """The penalty over `window` `[<= W]`, then the warpers: `transformers`' processors (from the `start`-th).
    Every id in a context is below the vocabulary: the model read it (`state.prefill` checks the prefix)."""
    processors: list[Any] = list(_processors(cfg))[start:]
    if all(type(processor) in _FAST_PROCESSORS for processor in processors):
        for processor in processors:
            scores = _FAST_PROCESSORS[type(processor)](processor, window, scores)
        return scores
    for processor in processors:  # called directly: `LogitsProcessorList.__call__` inspects each signature per call
        scores = processor(window[None], scores[None])[0]
    return scores


def _penalise(processor: RepetitionPenaltyLogitsProcessor, window: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """`RepetitionPenaltyLogitsProcessor`, in place on the window's entries only."""
    picked = scores.index_select(0, window)
    # A repeated id writes the same value each time: each is computed from the unpenalised score.
    return scores.scatter_(0, window, torch.where(picked < 0, picked * processor.penalty, picked / processor.penalty))


def _divide(processor: TemperatureLogitsWarper, window: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """`TemperatureLogitsWarper`, in place."""
    return scores.div_(processor.temperature)


def _cut_min_p(processor: MinPLogitsWarper, window: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """`MinPLogitsWarper` (keeping one token), in place, without its top-k and out-of-place fill."""
    probs = torch.softmax(scores, dim=-1)
    # min_p < 1, so the top token is never below min_p times itself: the warper's keep-the-top-token step is a no-op.
    return scores.masked_fill_(probs < processor.min_p * probs.max(), processor.filter_value)


# Bit-identical to transformers' processors (tests/test_sampling_fast.py); other processors take the general path.
_FAST_PROCESSORS = {
    RepetitionPenaltyLogitsProcessor: _penalise,
    TemperatureLogitsWarper: _divide,
    MinPLogitsWarper: _cut_min_p,
}


def _script_filter(cfg: SamplingConfig) -> ScriptFilter:
    if cfg.script_filter is None or cfg.script_filter.scripts != cfg.scripts:
        raise ConfigError("the scripts filter needs the tokenizer: attach it with run_model.bind_scripts")
    return cfg.script_filter


def _capped_rule(
    name: str, cap: int, rule: WordLengthRule | CapitalsRule | WhitespaceRule | None
) -> WordLengthRule | CapitalsRule | WhitespaceRule:
    """The built rule of a cap, checked to be built for that cap."""
    if rule is None or rule.cap != cap:
        raise ConfigError(f"the {name} rule needs the tokenizer: attach it with run_model.bind_scripts")
    return rule


def _spacing_rule(cfg: SamplingConfig) -> SpacingRule:
    if cfg.spacing_rule is None:
        raise ConfigError("the spacing rule needs the tokenizer: attach it with run_model.bind_scripts")
    return cfg.spacing_rule


def xtc_picks(position: int, cfg: SamplingConfig) -> bool:
    """Whether XTC's coin picks `position`: its own uniform under a salted seed."""
    return cfg.xtc_probability is not None and position_uniform(cfg.seed, position, salt="xtc") < cfg.xtc_probability


def exclude_top_choices(scores: torch.Tensor, position: int, cfg: SamplingConfig) -> torch.Tensor:
    """XTC (llama.cpp's "exclude top choices"): at the positions its coin picks, drop every token at or
    above the threshold's probability except the least likely of them, so a run that has locked onto
    one continuation (a chant, a list) takes another good one. The coin is this position's own uniform
    under a salted seed: a function of the seed and the position alone, the same in plain and
    accelerated decoding, like every draw."""
    return excluded_top_choices(scores, cfg) if xtc_picks(position, cfg) else scores


def excluded_top_choices(scores: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """XTC's exclusion at a picked position, without a host synchronisation."""
    probs = torch.softmax(scores.double(), dim=-1)
    top = probs >= cfg.xtc_threshold  # [vocab]
    kept = torch.where(top, probs, float("inf")).argmin()  # the least likely of the top choices stays
    drop = top.index_fill(0, kept[None], False) & (top.sum() >= 2)
    return scores.masked_fill(drop, -float("inf"))


def target_probs(logits: torch.Tensor, context: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """The target distribution `[vocab]` (float64); one-hot on the argmax when greedy."""
    scores = target_scores(logits, context, cfg)
    if cfg.greedy:
        return torch.nn.functional.one_hot(scores.argmax(), scores.shape[-1]).double()
    return torch.softmax(scores.double(), dim=-1)


def choose(logits: torch.Tensor, context: torch.Tensor, position: int, cfg: SamplingConfig) -> int:
    """The token at absolute `position`: argmax when greedy, else the inverse CDF at its uniform. On a CPU
    the fused kernel scores and draws (`_fused`); what it leaves undecided is decided here."""
    picked = not cfg.greedy and xtc_picks(position, cfg)
    u = 0.0 if cfg.greedy else position_uniform(cfg.seed, position)
    mode = fused.ARGMAX if cfg.greedy else fused.SCORES if picked else fused.DRAW
    fast = _fused(logits, context, cfg, mode, u, out=fused.buffer(logits.shape[-1]))
    if fast is not None and fast[1] is not None:
        return fast[1]
    scores = reference_scores(logits, context, cfg) if fast is None else fast[0]
    if cfg.greedy:
        return int(scores.argmax())
    if picked:
        scores = excluded_top_choices(scores, cfg)
    if scores.device.type != "cpu":  # the full CDF on the device: one host sync, where the shortcut takes three
        return _draw_full(scores, u)
    kept = torch.nonzero(scores != -float("inf")).flatten()  # NaN and +inf stay: they fail the check below
    if 0 < kept.numel() <= MAX_SEARCHED:
        token = _draw_kept(kept.tolist(), scores[kept].tolist(), u)
        if token is not None:
            return token
    return _draw_full(scores, u)


MAX_SEARCHED = 1024  # more finite scores (no min-p): the CDF over the whole vocabulary is as cheap


def _fused(
    logits: torch.Tensor, context: torch.Tensor, cfg: SamplingConfig, mode: int, u: float = 0.0,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, int | None] | None:  # fmt: skip
    """(the target's scores, the token `mode` asks for or None) by the fused kernel, then by the torch code
    for the rules it left (top-p, eta; min-p where a score sits at its cut); None where it cannot score."""
    if not fused.usable(logits, context):
        return None
    plan = _plan(cfg)
    banned = [rule.banned(context[-last:].tolist()) for rule, last in filter_rules(cfg)]
    result = fused.run(plan, logits, context, banned, mode if plan.complete else fused.SCORES, u, MAX_SEARCHED, out)
    if result is None:
        return None
    scores, code = result
    start = plan.min_p_at if code == fused.MIN_P_UNSETTLED else plan.rest_at
    if start < plan.processors:
        scores = processed(scores, context[-cfg.penalty_window :], cfg, start)
    return scores, code if code >= 0 else None


@functools.lru_cache(maxsize=16)
def _plan(cfg: SamplingConfig) -> fused.Plan:
    table = dry_amounts(cfg, torch.device("cpu")) if cfg.dry_multiplier is not None else None
    return fused.plan(cfg, _processors(cfg), table)


def _draw_kept(tokens: list[int], scores: list[float], u: float) -> int | None:
    """The inverse CDF at `u` over the finite scores only, or None when it might not be the full CDF's.

    The full CDF is flat at the -inf scores (their probabilities are exact zeros, and cumsum adds them
    in order), so its steps are these ones, up to rounding: the normaliser is summed in another order
    here, and exp may differ by an ulp. Each value, and the target, then differs from the full CDF's by
    under (2n + 6) eps of the total, so a target farther than 8 (n + 2) eps from both steps around it
    picks the full CDF's token.
    """
    top = max(scores)
    weights = [math.exp(score - top) for score in scores]
    scale = 1.0 / sum(weights)
    cdf = list(itertools.accumulate(weight * scale for weight in weights))
    target = u * cdf[-1]
    k = min(bisect.bisect_left(cdf, target), len(cdf) - 1)
    below = cdf[k - 1] if k > 0 else 0.0
    rounding = 8 * (len(cdf) + 2) * sys.float_info.epsilon * cdf[-1]
    if below + rounding < target < cdf[k] - rounding:
        return tokens[k]
    return None


def _draw_full(scores: torch.Tensor, u: float) -> int:
    """The inverse CDF at `u` over the whole vocabulary, on the scores' device (one host sync: the token)."""
    return int(inverse_cdf(scores, u))


def inverse_cdf(scores: torch.Tensor, u: float | torch.Tensor) -> torch.Tensor:
    """The token `[1]` at the uniform `u` (a float or a float64 `[1]` on the scores' device), left there."""
    cdf = torch.softmax(scores.double(), dim=-1).cumsum(0)  # [vocab]
    target = cdf[-1:] * u  # u * total, as a float64 product on the host would round it, without reading cdf
    return torch.searchsorted(cdf, target).clamp_(max=cdf.shape[0] - 1)
