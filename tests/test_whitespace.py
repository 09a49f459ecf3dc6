"""The whitespace rule: no more than `--max-spaces` whitespace characters in a row, losslessly."""

from __future__ import annotations

import dataclasses
import random
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
from tokenswift_cli.sampling.whitespace import WhitespaceRule, longest_run, whitespace_runs

PIECES = [b" the", b"lamp", b" ", b"  ", b"\n", b"   \n", b"\n\n", b"\t", b"a  b", b" \n  \n", b"x", b"\r\n",
          b"        ", "é".encode(), b"keeper ", b"\x0c"]  # fmt: skip
_RUN = re.compile(r"[ \t\n\r\x0b\x0c]+")


def trailing(text: bytes) -> int:
    """The rule's definition read as text: the whitespace characters `text` ends with."""
    return len(text) - len(text.rstrip(b" \t\n\r\x0b\x0c"))


def longest_after(text: bytes, before: bytes) -> int:
    """The longest whitespace run of `before + text` that ends within `text`."""
    runs = _RUN.finditer((before + text).decode())
    return max((len(r.group()) for r in runs if r.end() > len(before.decode())), default=0)


def test_runs_are_whitespace_bytes_between_other_bytes() -> None:
    assert whitespace_runs(b" \n a  ") == [3, None, 2] and whitespace_runs(b"") == [0] and whitespace_runs(b"\t") == [1]
    assert whitespace_runs(b"ab") == [0, None, 0, None, 0] and whitespace_runs("é ".encode())[-1] == 1
    assert longest_run("a  \n   \nb c") == 7 and longest_run("") == 0 and longest_run("word") == 0


def test_the_rule_bans_what_would_take_the_run_past_the_cap() -> None:
    rule = WhitespaceRule(PIECES, len(PIECES) + 2, cap=4)  # two ids past the vocabulary: never banned
    assert rule.context_tokens == 5
    assert rule.state([]) == 0 and rule.state([0]) == 0 and rule.state([2]) == 1 and rule.state([3, 4]) == 3
    assert (
        rule.state([5, 1]) == 0
        and rule.state([8]) == 0
        and rule.state([14]) == 1
        and rule.state([2] * 9) == 4
        and rule.state([16]) == 0
    )
    assert rule.state([3, 16, 2]) == 3  # an id past the vocabulary adds nothing and ends nothing

    def names(state: int) -> set[bytes]:
        return {PIECES[i] for i, banned in enumerate(rule.banned_after(state).tolist()) if banned}

    assert names(0) == {b" \n  \n", b"        "}  # too long alone
    assert names(1) == names(0) | {b"   \n"}
    assert names(4) == {p for p in PIECES if whitespace_runs(p)[0]}  # only what opens with another byte


def test_the_state_and_the_bans_are_the_definition_s() -> None:
    rng = random.Random(0)
    rule = WhitespaceRule(PIECES, len(PIECES), cap=6)
    for _ in range(400):
        context = [rng.randrange(len(PIECES)) for _ in range(rng.randint(0, 30))]
        spelled = b"".join(PIECES[t] for t in context[-rule.context_tokens :])
        assert rule.state(context) == min(trailing(spelled), 6), spelled
        allowed = [trailing(spelled + p) <= 6 and longest_after(p, spelled) <= 6 for p in PIECES]
        assert rule.banned(context).tolist() == [not ok for ok in allowed], spelled


def test_the_rule_is_a_setting_recorded_and_built_from_the_tokenizer() -> None:
    sampling = SamplingConfig(temperature=1.0, max_spaces=12)
    with pytest.raises(ConfigError, match="needs the tokenizer"):
        target_scores(torch.zeros(8), torch.tensor([1, 2]), sampling)
    with pytest.raises(ConfigError, match="whitespace cap must be >= 1"):
        SamplingConfig(max_spaces=0)
    bound = with_scripts_filter(sampling, byte_level_tokenizer(), 400)
    assert bound.spaces_rule is not None and bound.spaces_rule.cap == 12 and bound.context_length == 1024
    assert bound == dataclasses.replace(bound, spaces_rule=None)
    recorded = RunConfig(max_new_tokens=8, sampling=bound).to_dict()["sampling"]
    assert recorded["max_spaces"] == 12 and "spaces_rule" not in recorded
    assert RunConfig.from_dict(RunConfig(max_new_tokens=8, sampling=bound).to_dict()).sampling == bound
    assert SamplingConfig(max_spaces=2000, penalty_window=64).context_length == 2001  # the rule's own tokens
    older = RunConfig(max_new_tokens=8).to_dict()
    del older["sampling"]["max_spaces"]  # settings written before the rule existed: off
    assert RunConfig.from_dict(older).sampling.max_spaces is None


@pytest.mark.parametrize("greedy", [True, False])
def test_tokenswift_equals_plain_under_the_rule_and_no_run_passes_the_cap(family: str, greedy: bool) -> None:
    target = tiny_target(family)
    vocabulary = [PIECES[i % len(PIECES)] for i in range(VOCAB)]
    heads, prompt = random_heads(target), random_prompt(80)
    rule = WhitespaceRule(vocabulary, VOCAB, cap=3)
    free = SamplingConfig(temperature=0.0 if greedy else 1.0, seed=3, penalty=2.0, penalty_window=16)  # no loop
    sampling = dataclasses.replace(free, max_spaces=3, spaces_rule=rule)
    cfg = RunConfig(max_new_tokens=160, sampling=sampling)
    plain, _ = generate_tokens(target, None, prompt, cfg.replace(mode="plain"))
    fast, stats = generate_tokens(target, heads, prompt, cfg)
    unruled, _ = generate_tokens(target, None, prompt, cfg.replace(mode="plain", sampling=free))
    assert first_divergence(fast, plain) is None
    spell = lambda tokens: b"".join(vocabulary[t] for t in tokens)  # noqa: E731
    assert longest_after(spell(plain), spell(prompt)) <= max(3, trailing(spell(prompt)))  # a run the prompt ends with
    assert longest_after(spell(unruled), spell(prompt)) > 3  # the rule had work to do
    assert stats.iterations < 160
