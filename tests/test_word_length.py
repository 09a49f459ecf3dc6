"""The word-length rule: no word longer than `--max-word` characters, losslessly."""

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
from tokenswift_cli.sampling.word_length import WordLengthRule, word_runs


def longest_word(text: bytes, after: bytes = b"") -> int:
    """The rule's definition read as text: runs of characters below U+0800 other than ASCII whitespace,
    of `after + text`, those ending within `text`."""
    start = len(after.decode())
    words = re.finditer(r"[^ \t\n\r\x0b\x0c\u0800-\U0010ffff]+", (after + text).decode())
    return max((len(w.group()) for w in words if w.end() > start), default=0)


def test_words_are_runs_of_narrow_characters_between_spaces() -> None:
    assert word_runs(b"ab cd") == [2, None, 2] and word_runs(b" the") == [0, None, 3] and word_runs(b"") == [0]
    assert word_runs("café".encode()) == [4] and word_runs(b"\xa9e") == [1]  # a continuation byte: counted before
    assert word_runs("a—b".encode()) == [1, None, 1] and word_runs("什么".encode()) == [0, None, 0, None, 0]
    assert word_runs(b"x\n\ny") == [1, None, 0, None, 1]


def test_the_rule_bans_what_would_take_the_word_past_the_cap() -> None:
    vocabulary = [b" the", b"abcd", b"ab cd", b"abcdef", b" abcdefg", b"\n", "é".encode(), "—".encode(), b"a"]
    rule = WordLengthRule(vocabulary, 11, cap=5)  # two ids past the vocabulary: never banned
    assert rule.context_tokens == 23
    assert rule.state([]) == 0 and rule.state([0]) == 3 and rule.state([0, 1]) == 5 and rule.state([2]) == 2
    assert rule.state([1, 5]) == 0 and rule.state([0, 6]) == 4 and rule.state([1, 7]) == 0 and rule.state([9]) == 0
    assert rule.state([8] * 30) == 5 and rule.state([0, 9, 8]) == 4  # capped; an id past the vocabulary adds nothing

    def names(state: int) -> set[bytes]:
        return {vocabulary[i] for i, banned in enumerate(rule.banned_after(state).tolist()) if banned}

    assert names(0) == {b"abcdef", b" abcdefg"}  # too long alone, or holds a word too long
    assert names(2) == {b"abcd", b"abcdef", b" abcdefg"}  # "ab cd" leaves 2 open: only 3 more
    assert names(5) == {b"abcd", b"ab cd", b"abcdef", b" abcdefg", "é".encode(), b"a"}
    assert rule.banned([0, 8]).tolist() == rule.banned_after(4).tolist()


def test_the_rule_is_a_setting_recorded_and_built_from_the_tokenizer() -> None:
    sampling = SamplingConfig(temperature=1.0, max_word=12)
    with pytest.raises(ConfigError, match="needs the tokenizer"):
        target_scores(torch.zeros(8), torch.tensor([1, 2]), sampling)
    with pytest.raises(ConfigError, match="word cap must be >= 1"):
        SamplingConfig(max_word=0)
    bound = with_scripts_filter(sampling, byte_level_tokenizer(), 400)
    assert bound.word_rule is not None and bound.word_rule.cap == 12 and bound.context_length == 1024
    assert bound == dataclasses.replace(bound, word_rule=None)
    recorded = RunConfig(max_new_tokens=8, sampling=bound).to_dict()["sampling"]
    assert recorded["max_word"] == 12 and "word_rule" not in recorded
    assert RunConfig.from_dict(RunConfig(max_new_tokens=8, sampling=bound).to_dict()).sampling == bound
    assert SamplingConfig(max_word=400, penalty_window=64).context_length == 1603  # the rule's own tokens


def _vocabulary() -> list[bytes]:
    """A vocabulary for the tiny models where words without a space grow long unless cut."""
    pieces = [b"lamp", b"keeper", b" the", b"-", b"ab", b"\n", b"Lit", "é".encode(), "—".encode(), b"x"]
    return [pieces[i % len(pieces)] for i in range(VOCAB)]


@pytest.mark.parametrize("greedy", [True, False])
def test_tokenswift_equals_plain_under_the_rule_and_no_word_passes_the_cap(family: str, greedy: bool) -> None:
    target = tiny_target(family)
    vocabulary = _vocabulary()
    heads, prompt = random_heads(target), random_prompt(80)
    rule = WordLengthRule(vocabulary, VOCAB, cap=9)
    free = SamplingConfig(temperature=0.0 if greedy else 1.0, seed=3, penalty=2.0, penalty_window=16)  # no loop
    sampling = dataclasses.replace(free, max_word=9, word_rule=rule)
    cfg = RunConfig(max_new_tokens=160, sampling=sampling)
    plain, _ = generate_tokens(target, None, prompt, cfg.replace(mode="plain"))
    fast, stats = generate_tokens(target, heads, prompt, cfg)
    unruled, _ = generate_tokens(target, None, prompt, cfg.replace(mode="plain", sampling=free))
    assert first_divergence(fast, plain) is None
    spell = lambda tokens: b"".join(vocabulary[t] for t in tokens)  # noqa: E731
    assert longest_word(spell(plain), after=spell(prompt)) <= 9  # the word the prompt ends with counts
    assert longest_word(spell(unruled), after=spell(prompt)) > 9  # the rule had work to do
    assert stats.iterations < 160
