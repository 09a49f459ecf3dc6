"""The spacing rule: no letter directly after , ; ! or ?, losslessly (TokenSwift writes plain decoding's text)."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch
from conftest import VOCAB
from helpers import first_divergence, random_heads, random_prompt, tiny_target
from test_scripts import byte_level_tokenizer

from tokenswift_cli.config import ConfigError, RunConfig, SamplingConfig
from tokenswift_cli.engine.decode import generate_tokens
from tokenswift_cli.runs.run_model import with_scripts_filter
from tokenswift_cli.sampling.distribution import target_scores
from tokenswift_cli.sampling.spacing import SpacingRule, holds_mark_then_letter, starts_with_letter

MARK_THEN_LETTER = re.compile(rb"[,;!?](?:[A-Za-z]|\xc3[\x80-\xbf])")


def test_which_pieces_start_with_a_letter() -> None:
    assert starts_with_letter(b"the") and starts_with_letter("été".encode()) and starts_with_letter("Ωx".encode())
    assert not any(starts_with_letter(p) for p in [b" the", b"3,000", b'"', b"!", b"", b"\xc3", b"\xa9e"])
    assert holds_mark_then_letter(b",the") and holds_mark_then_letter(b"a?b") and holds_mark_then_letter(",é".encode())
    assert not any(holds_mark_then_letter(p) for p in [b", the", b"3,000", b"?!", b',"', b"the,", b"e.g"])


def test_the_rule_bans_letters_after_a_mark_only() -> None:
    vocabulary = [b" the", b"the", b",", b"!", b"3", b'"', b",the", b".", b"x", "é".encode()]
    rule = SpacingRule(vocabulary, 12)  # two ids past the vocabulary: never banned
    after_mark = [b in (b"the", b",the", b"x", "é".encode()) for b in vocabulary] + [False, False]
    assert rule.banned([4, 2]).tolist() == after_mark and rule.banned([3]).tolist() == after_mark
    assert rule.banned([2, 7]).tolist() == [b == b",the" for b in vocabulary] + [False, False]  # "e.g" is fine
    assert rule.banned([]).tolist() == rule.banned([0]).tolist()


def test_the_rule_is_a_setting_recorded_and_built_from_the_tokenizer() -> None:
    sampling = SamplingConfig(temperature=1.0, spacing=True)
    with pytest.raises(ConfigError, match="needs the tokenizer"):
        target_scores(torch.zeros(8), torch.tensor([1, 2]), sampling)
    bound = with_scripts_filter(sampling, byte_level_tokenizer(), 400)
    assert bound.spacing_rule is not None and bound == dataclasses.replace(bound, spacing_rule=None)
    recorded = RunConfig(max_new_tokens=8, sampling=bound).to_dict()["sampling"]
    assert recorded["spacing"] is True and "spacing_rule" not in recorded
    assert RunConfig.from_dict(RunConfig(max_new_tokens=8, sampling=bound).to_dict()).sampling == bound
    assert with_scripts_filter(SamplingConfig(), byte_level_tokenizer(), 400).spacing_rule is None


def _vocabulary() -> list[bytes]:
    """A vocabulary for the tiny models where marks, letters and spaced words are all common."""
    pieces = [b" the", b"lamp", b",", b"!", b" keeper", b"a", b"?", b";", b" lit", b"3", b".", "é".encode()]
    return [pieces[i % len(pieces)] for i in range(VOCAB)]


@pytest.mark.parametrize("greedy", [True, False])
def test_tokenswift_equals_plain_under_the_rule_and_spaces_after_marks(family: str, greedy: bool) -> None:
    target = tiny_target(family)
    vocabulary = _vocabulary()
    heads, prompt = random_heads(target), random_prompt(80)
    rule = SpacingRule(vocabulary, VOCAB)
    free = SamplingConfig(temperature=0.0 if greedy else 1.0, seed=3, penalty=2.0, penalty_window=16)  # no loop
    sampling = dataclasses.replace(free, spacing=True, spacing_rule=rule)
    cfg = RunConfig(max_new_tokens=160, sampling=sampling)
    plain, _ = generate_tokens(target, None, prompt, cfg.replace(mode="plain"))
    fast, stats = generate_tokens(target, heads, prompt, cfg)
    unruled, _ = generate_tokens(target, None, prompt, cfg.replace(mode="plain", sampling=free))
    assert first_divergence(fast, plain) is None
    written = b"".join(vocabulary[t] for t in [prompt[-1], *plain])
    assert MARK_THEN_LETTER.search(written) is None
    assert MARK_THEN_LETTER.search(b"".join(vocabulary[t] for t in unruled))  # the rule had work to do
    assert stats.iterations < 160
