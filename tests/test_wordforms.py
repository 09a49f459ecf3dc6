"""The penalty's word scope: a token in the window penalises every spelling of its word, losslessly."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from helpers import first_divergence, random_heads, random_prompt, tiny_target, tiny_word_forms
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, RepetitionPenaltyLogitsProcessor

from tokenswift_cli.config import ConfigError, RunConfig, SamplingConfig
from tokenswift_cli.decode import generate_tokens
from tokenswift_cli.sampling import target_scores
from tokenswift_cli.wordforms import WordForms, bind, word_form, word_forms_of

SPELLINGS = [" Angel", "Angel", "angel", " angel", " ANGEL", "ANGEL"]


def byte_level_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE like SmolLM2's, trained on lines that spell "angel" six ways."""
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    text = ["The Angel said: angel, ANGEL! angelic angel Angel.", "Angel", "ANGEL", "The keeper lit the lamp — café"]
    trainer = trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=["<|endoftext|>"]
    )
    backend.train_from_iterator(text * 20, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|endoftext|>")


def ids_of(tokenizer: PreTrainedTokenizerFast, spellings: list[str]) -> list[int]:
    ids = [tokenizer(s)["input_ids"] for s in spellings]
    assert all(len(i) == 1 for i in ids), ids  # each spelling is one token of the vocabulary
    return [i[0] for i in ids]


def test_word_form_strips_and_lowers_and_leaves_punctuation_and_spaces_alone() -> None:
    assert {word_form(s.encode()) for s in [*SPELLINGS, "angel\n"]} == {"angel"}
    assert word_form(b" 42") == "42" and word_form(" café".encode()) == "café"
    assert [word_form(p) for p in [b" ", b"\n\n", b".", b" ,", " —".encode(), b"\xc3", b""]] == [None] * 7


def test_word_classes_of_a_byte_level_vocabulary() -> None:
    tokenizer = byte_level_tokenizer()
    forms = word_forms_of(tokenizer, len(tokenizer) + 2)  # two rows past the vocabulary: their own classes
    angel = ids_of(tokenizer, SPELLINGS)
    assert len(set(forms.classes[angel].tolist())) == 1
    assert sorted(t for t in forms.members[angel[0]].tolist() if t < forms.vocab_size) == sorted(angel)
    alone = ids_of(tokenizer, [" ", ".", ",", " —", "<|endoftext|>"]) + [len(tokenizer), len(tokenizer) + 1]
    for token in alone:  # whitespace, punctuation, the special token, rows past the vocabulary: token scope
        assert (forms.classes == forms.classes[token]).sum() == 1
        assert forms.members[token].tolist() == [token] + [forms.vocab_size] * (forms.members.shape[1] - 1)
    assert forms.classes[ids_of(tokenizer, [" angelic"])] != forms.classes[angel[0]]  # another word
    assert word_forms_of(tokenizer, len(tokenizer) + 2) is forms  # built once per vocabulary


def test_a_word_in_the_window_penalises_its_other_spellings() -> None:
    tokenizer = byte_level_tokenizer()
    vocab = len(tokenizer)
    angel, keeper = ids_of(tokenizer, SPELLINGS), ids_of(tokenizer, [" keeper"])[0]
    torch.manual_seed(0)
    logits = torch.randn(vocab) * 3
    logits[angel[0]], logits[angel[4]] = 2.0, -1.0  # " Angel" above zero, " ANGEL" below
    context = torch.tensor(ids_of(tokenizer, ["The", " lamp", "angel", "."]))
    token = SamplingConfig(penalty=2.0, penalty_window=8)
    word = bind(dataclasses.replace(token, penalty_scope="word"), tokenizer, vocab)
    by_token, by_word = target_scores(logits, context, token), target_scores(logits, context, word)
    assert (by_word[angel[0]], by_word[angel[4]]) == (1.0, -2.0)  # HF's formula: score / p, or score * p if < 0
    assert (by_token[angel[0]], by_token[angel[4]]) == (2.0, -1.0)  # token scope: only "angel" itself
    assert word.word_forms is not None
    classes = word.word_forms.classes  # [vocab]
    penalised = torch.isin(classes, classes[context]).nonzero().flatten()  # every spelling of the window's words
    assert set(angel) <= set(penalised.tolist())
    expected = RepetitionPenaltyLogitsProcessor(2.0)(penalised[None], logits[None].clone())[0]
    torch.testing.assert_close(by_word, expected, rtol=0, atol=0)  # once per token, the rest untouched
    assert by_word[keeper] == logits[keeper] and by_token[angel[2]] == by_word[angel[2]]


def test_word_scope_with_no_shared_forms_is_token_scope() -> None:
    torch.manual_seed(1)
    logits, context = torch.randn(50) * 3, torch.randint(0, 50, (40,))
    forms = WordForms([f" w{i}".encode() for i in range(50)], 50)
    token = SamplingConfig(temperature=1.0, min_p=0.05, penalty=1.3, penalty_window=16)
    word = dataclasses.replace(token, penalty_scope="word", word_forms=forms)
    assert torch.equal(target_scores(logits, context, word), target_scores(logits, context, token))


def test_scope_settings() -> None:
    with pytest.raises(ConfigError, match="unknown penalty scope 'words': use token or word"):
        SamplingConfig(penalty_scope="words")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="needs the tokenizer"):
        target_scores(torch.zeros(8), torch.tensor([1, 2]), SamplingConfig(penalty=1.2, penalty_scope="word"))
    assert target_scores(torch.ones(8), torch.tensor([1]), SamplingConfig(penalty_scope="word"))[1] == 1  # no penalty
    tokenizer = byte_level_tokenizer()
    assert bind(SamplingConfig(penalty=1.2), tokenizer, len(tokenizer)).word_forms is None  # token scope needs none
    bound = bind(SamplingConfig(penalty=1.2, penalty_scope="word"), tokenizer, len(tokenizer))
    assert bound.word_forms is not None and bound == dataclasses.replace(bound, word_forms=None)
    recorded = RunConfig(max_new_tokens=8, sampling=bound).to_dict()
    assert recorded["sampling"]["penalty_scope"] == "word" and "word_forms" not in recorded["sampling"]
    assert RunConfig.from_dict(recorded).sampling == bound
    del recorded["sampling"]["penalty_scope"]  # a run recorded before the option
    assert RunConfig.from_dict(recorded).sampling.penalty_scope == "token"


def test_word_scope_changes_the_text_and_tokenswift_still_writes_plains() -> None:
    target = tiny_target("llama-gqa", seed=2)
    prompt = random_prompt(80, seed=5)
    token = SamplingConfig(temperature=1.0, min_p=0.05, penalty=1.5, penalty_window=32, seed=6)
    word = dataclasses.replace(token, penalty_scope="word", word_forms=tiny_word_forms())
    cfg = RunConfig(max_new_tokens=200, mode="plain", sampling=word)
    plain, _ = generate_tokens(target, None, prompt, cfg)
    fast, stats = generate_tokens(target, random_heads(target), prompt, cfg.replace(mode="tokenswift"))
    by_token, _ = generate_tokens(target, None, prompt, cfg.replace(sampling=token))
    assert first_divergence(fast, plain) is None and stats.iterations < 200
    assert first_divergence(plain, by_token) is not None
