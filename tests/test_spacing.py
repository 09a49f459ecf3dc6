"""The spacing rule: no letter right after , ; ! ? nor a capital after a small letter, losslessly."""

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
from tokenswift_cli.sampling.spacing import SpacingRule, first_char, glued, holds_glued_pair, last_char

GLUED = re.compile(rb"[,;!?](?:[A-Za-z]|\xc3[\x80-\xbf])|[a-z][A-Z]")


def test_which_characters_are_glued() -> None:
    assert first_char("été".encode()) == "é" and first_char(b"\xc3") == "" and first_char(b"\xa9e") == ""
    assert last_char(" café".encode()) == "é" and last_char(b"ab\xc3") == "" and last_char(b"") == ""
    assert glued(",", "t") and glued("?", "É") and glued("a", "B") and glued("é", "Ω")
    assert not any(glued(a, b) for a, b in [(",", " "), (",", "3"), ("?", "!"), (",", '"'), ("A", "B"), ("a", "b")])
    assert holds_glued_pair(b",the") and holds_glued_pair(b"McDonald") and holds_glued_pair(",é".encode())
    assert not any(holds_glued_pair(p) for p in [b", the", b"3,000", b"?!", b',"', b"the,", b"e.g", b"USA"])


def test_the_rule_bans_by_the_last_character() -> None:
    vocabulary = [b" the", b"the", b",", b"!", b"3", b'"', b",the", b"The", b"x", "é".encode(), b"iPhone", b"A"]
    rule = SpacingRule(vocabulary, 14)  # two ids past the vocabulary: never banned
    always = [b in (b",the", b"iPhone") for b in vocabulary] + [False, False]
    letters = [b in (b"the", b",the", b"The", b"x", "é".encode(), b"iPhone", b"A") for b in vocabulary] + [False] * 2
    capitals = [b in (b",the", b"The", b"iPhone", b"A") for b in vocabulary] + [False, False]
    assert rule.banned([4, 2]).tolist() == letters and rule.banned([3]).tolist() == letters  # after , and !
    assert rule.banned([0]).tolist() == capitals and rule.banned([9]).tolist() == capitals  # after "e" and "é"
    assert rule.banned([7, 4]).tolist() == always and rule.banned([11]).tolist() == always  # after "3" and "A"
    assert rule.banned([]).tolist() == always and rule.banned([13]).tolist() == always


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
    pieces = [b" the", b"lamp", b",", b"!", b" Keeper", b"a", b"?", b"Lit", b" lit", b"3", b".", "é".encode()]
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
    assert GLUED.search(written) is None
    assert GLUED.search(b"".join(vocabulary[t] for t in unruled))  # the rule had work to do
    assert stats.iterations < 160
