"""The capitals rule: no more than `--max-capitalised` capitalised words in a row, losslessly."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch
from conftest import VOCAB
from helpers import first_divergence, random_heads, random_prompt, tiny_target
from test_scripts import byte_level_tokenizer

from tokenswift_cli.config import ConfigError, RunConfig, SamplingConfig
from tokenswift_cli.engine.decode import generate_tokens
from tokenswift_cli.runs.run_model import with_scripts_filter
from tokenswift_cli.sampling.capitals import (
    INSIDE,
    LONE_CAPITAL,
    OUTSIDE,
    CapitalsRule,
    Passage,
    characters,
    longest_run,
    passage,
)
from tokenswift_cli.sampling.distribution import target_scores

# Whole characters only (split bytes are tested on their own): the text definition below reads them as they are.
PIECES = [b" The", b" KEEP", b"ER", b" lamp", b",", b" the", b"-", b"\n", b" A", b"x", b"Lit", b"3", b" '",
          "é".encode(), " Émile".encode(), b"I", b"  ", b". It", b"a", b"O"]  # fmt: skip


def in_a_row(text: str) -> list[int]:
    """The rule's definition read as text: after each character, the capitalised words of two characters or
    more in a row (words: runs of letters, digits and apostrophes; a small-letter word starts again)."""
    counts, count, word = [], 0, ""
    for char in text:
        if char.isalnum() or char in "'’":
            word += char
            if len(word) == 1 and char.islower():
                count = 0
            elif len(word) == 2 and word[0].isupper():
                count += 1
        else:
            word = ""
        counts.append(count)
    return counts


def spell(tokens: list[int]) -> str:
    return b"".join(PIECES[t] for t in tokens).decode()


def test_pieces_read_as_characters_and_passages() -> None:
    assert characters("Émile".encode()) == list("Émile") and characters(b"") == []
    assert characters(b"a\xc3") == ["a", "\u05d0"] and characters(b"\xa9b") == ["", "b"]  # a letter opens; continues
    assert characters(b"\xc2") == [","] and characters("—".encode()[:2]) == [",", ""]  # Latin-1 signs, wide characters
    assert passage(b" Ethnic", OUTSIDE) == Passage(lead=1, inner=0, resets=False, tail=1, exit=INSIDE)
    assert passage(b" E", OUTSIDE).exit == LONE_CAPITAL and passage(b"t", LONE_CAPITAL).lead == 1
    assert passage(b"ETH", INSIDE) == Passage(lead=0, inner=0, resets=False, tail=0, exit=INSIDE)  # one word, counted
    assert passage(b"AB cd EF GH", OUTSIDE) == Passage(lead=1, inner=2, resets=True, tail=2, exit=INSIDE)
    assert passage(b" I", OUTSIDE).lead == 0 and passage(b" 3rd", OUTSIDE).resets is False  # neither counts
    assert passage("—HOLL".encode(), INSIDE).lead == 1  # a dash ends a word


def test_the_state_is_the_text_definition() -> None:
    rule = CapitalsRule(PIECES, len(PIECES), cap=3)
    assert rule.context_tokens == 1024
    rng = random.Random(0)
    for _ in range(3000):
        context = [rng.randrange(len(PIECES)) for _ in range(rng.randint(0, 32))]
        text = spell(context)
        count, where = rule.state(context)
        assert count == min((in_a_row(text) or [0])[-1], 3), text
        last = text[-1:]
        inside = bool(last) and (last.isalnum() or last in "'")
        assert (where != OUTSIDE) == inside, text


def test_a_token_is_banned_when_it_would_pass_the_cap() -> None:
    rule = CapitalsRule([*PIECES, b"AB cd EF GH IJ KL"], len(PIECES) + 3, cap=3)  # two ids past the vocabulary
    pieces = [*PIECES, b"AB cd EF GH IJ KL"]
    rng = random.Random(1)
    fired = 0
    for _ in range(400):
        context = [rng.randrange(len(PIECES)) for _ in range(rng.randint(0, 24))]
        before = spell(context)
        banned = rule.banned(context).tolist()
        assert banned[-2:] == [False, False]
        for token, piece in enumerate(pieces):
            counts = [0, *in_a_row(before + piece.decode())][len(before) :]  # from the count `before` ends with
            counted = [now for was, now in zip(counts, counts[1:], strict=False) if now > was]  # a word counted
            assert banned[token] == any(now > 3 for now in counted), (before, piece)
            fired += banned[token] and token != len(PIECES)
    assert fired > 100  # the cap was met often enough to matter
    assert rule.banned_after((0, OUTSIDE))[len(PIECES)]  # four in a row inside one token: always banned


def test_the_longest_run_of_a_text_is_the_rule_s_count() -> None:
    rng = random.Random(2)
    for _ in range(300):
        text = spell([rng.randrange(len(PIECES)) for _ in range(rng.randint(0, 60))])
        assert longest_run(text) == max(in_a_row(text), default=0), text
    assert longest_run("Henry V. (1600). King Lear (1608). A Midsummer Night's Dream, and THE END") == 6


def test_the_state_is_read_from_the_last_tokens_only() -> None:
    rule = CapitalsRule(PIECES, len(PIECES), cap=2)
    catalog = [1, 4] * 40  # " KEEP," forty times: the window holds only capitals
    assert rule.state(catalog) == (2, OUTSIDE) and rule.state([5, *catalog]) == (2, OUTSIDE)
    assert rule.state([*catalog, 5]) == (0, INSIDE) and rule.state([*catalog, 5, 0]) == (1, INSIDE)
    assert rule.state([]) == (0, OUTSIDE) and rule.state([len(PIECES) + 5]) == (0, OUTSIDE)
    lines = [7] * 1022  # "The KEEP" and lines: the first word counts only while the last 1,024 tokens hold it
    assert rule.state([0, 1, *lines]) == (2, OUTSIDE) and rule.state([0, 1, 7, *lines]) == (1, OUTSIDE)


def test_the_rule_is_a_setting_recorded_and_built_from_the_tokenizer() -> None:
    sampling = SamplingConfig(temperature=1.0, max_capitalised=12)
    with pytest.raises(ConfigError, match="needs the tokenizer"):
        target_scores(torch.zeros(8), torch.tensor([1, 2]), sampling)
    with pytest.raises(ConfigError, match="capitals cap must be >= 1"):
        SamplingConfig(max_capitalised=0)
    bound = with_scripts_filter(sampling, byte_level_tokenizer(), 400)
    assert bound.capitals_rule is not None and bound.capitals_rule.cap == 12 and bound.context_length == 1024
    assert bound == dataclasses.replace(bound, capitals_rule=None)
    recorded = RunConfig(max_new_tokens=8, sampling=bound).to_dict()["sampling"]
    assert recorded["max_capitalised"] == 12 and "capitals_rule" not in recorded
    assert RunConfig.from_dict(RunConfig(max_new_tokens=8, sampling=bound).to_dict()).sampling == bound
    assert SamplingConfig(max_capitalised=200, penalty_window=64).context_length == 1608  # the rule's own tokens
    older = RunConfig(max_new_tokens=8).to_dict()
    del older["sampling"]["max_capitalised"]  # settings written before the rule existed: off
    assert RunConfig.from_dict(older).sampling.max_capitalised is None


@pytest.mark.parametrize("greedy", [True, False])
def test_tokenswift_equals_plain_under_the_rule_and_no_run_passes_the_cap(family: str, greedy: bool) -> None:
    target = tiny_target(family)
    vocabulary = [PIECES[i % len(PIECES)] for i in range(VOCAB)]
    heads, prompt = random_heads(target), random_prompt(80)
    rule = CapitalsRule(vocabulary, VOCAB, cap=2)
    free = SamplingConfig(temperature=0.0 if greedy else 1.0, seed=3, penalty=2.0, penalty_window=16)  # no loop
    sampling = dataclasses.replace(free, max_capitalised=2, capitals_rule=rule)
    cfg = RunConfig(max_new_tokens=160, sampling=sampling)
    plain, _ = generate_tokens(target, None, prompt, cfg.replace(mode="plain"))
    fast, stats = generate_tokens(target, heads, prompt, cfg)
    unruled, _ = generate_tokens(target, None, prompt, cfg.replace(mode="plain", sampling=free))
    assert first_divergence(fast, plain) is None
    spelled = lambda tokens: b"".join(vocabulary[t] for t in tokens).decode()  # noqa: E731
    before = in_a_row(spelled(prompt))
    rows = lambda tokens: in_a_row(spelled(prompt) + spelled(tokens))[len(before) :]  # noqa: E731
    assert max(rows(plain)) <= max(2, before[-1])  # a run the prompt ends with stands, and grows no more
    assert max(rows(unruled)) > 2  # the rule had work to do
    assert stats.iterations < 160
