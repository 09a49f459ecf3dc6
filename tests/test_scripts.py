"""The scripts filter: tokens that would put another script's character in the text are never drawn, losslessly."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import VOCAB
from helpers import first_divergence, random_heads, random_prompt, tiny_target
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from tokenswift_cli.config import ConfigError, RunConfig, SamplingConfig
from tokenswift_cli.engine.decode import generate_tokens
from tokenswift_cli.runs.run_model import with_scripts_filter
from tokenswift_cli.sampling.distribution import target_scores
from tokenswift_cli.sampling.scripts import ScriptFilter, parse_scripts, pending_bytes, scripts_of, token_bytes

FULLWIDTH_H = "Ｈ".encode()  # EF BC A8


def byte_level_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE like SmolLM2's, trained on a few lines: CJK and full-width letters split into byte pieces."""
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    text = ["The keeper lit the lamp — “again”, café naïve …", "ＨＨＨ ＵＶ グレード 什么名 🙏"] * 20
    trainer = trainers.BpeTrainer(vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator(text, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=backend)


def test_token_bytes_spell_the_text_of_a_byte_level_vocabulary() -> None:
    tokenizer = byte_level_tokenizer()
    vocabulary = token_bytes(tokenizer)
    text = "café — “Ｈ” グレ 什么 🙏 naïve\n"
    ids = tokenizer(text)["input_ids"]
    assert b"".join(vocabulary[i] for i in ids) == text.encode()


def test_pending_bytes_is_the_incomplete_character_at_the_end() -> None:
    assert pending_bytes(b"abc") == b""
    assert pending_bytes("é".encode()) == b""
    assert pending_bytes(b"a\xc3") == b"\xc3"
    assert pending_bytes(b"a" + FULLWIDTH_H[:2]) == FULLWIDTH_H[:2]
    assert pending_bytes(b"a" + FULLWIDTH_H) == b""
    assert pending_bytes(b"\xf0\x9f\x99") == b"\xf0\x9f\x99"


def test_latin_bans_fullwidth_and_cjk_bytes_and_keeps_accents_and_punctuation() -> None:
    pieces = [b"a", b" the", "é".encode(), " —".encode(), b"\xc3", b"\xa9", FULLWIDTH_H[:2], FULLWIDTH_H[2:], b"\xe2"]
    pieces += ["什".encode(), "😀".encode(), b"\x80", b"\x94"]
    latin = ScriptFilter(("latin",), pieces, len(pieces) + 2)  # two rows past the vocabulary: never drawn
    names = lambda banned: {pieces[i] for i in range(len(pieces)) if not banned[i]}  # noqa: E731
    assert names(latin.banned_after(b"")) == {b"a", b" the", "é".encode(), " —".encode(), b"\xc3", b"\xe2"}
    assert latin.banned_after(b"")[len(pieces) :].all()
    assert names(latin.banned_after(b"\xc3")) == {b"\xa9", FULLWIDTH_H[2:], b"\x80", b"\x94"}  # é è À Ô
    assert names(latin.banned_after(b"\xe2")) == {b"\x80"}  # U+2000-203F: general punctuation (needs one more)
    assert names(latin.banned([1, 4])) == names(latin.banned_after(b"\xc3"))
    cjk = ScriptFilter(("cjk",), pieces, len(pieces))
    assert {FULLWIDTH_H[:2], "什".encode()} <= names(cjk.banned_after(b""))
    assert FULLWIDTH_H[2:] in names(cjk.banned_after(FULLWIDTH_H[:2]))


def test_foreign_share_counts_characters_outside_the_scripts() -> None:
    from tokenswift_cli.quality.text import mean_word_length
    from tokenswift_cli.sampling.scripts import Alphabet

    assert Alphabet(("latin",)).foreign_share("café — ＨＨ 什") == pytest.approx(3 / 8)
    assert Alphabet(("cjk", "latin")).foreign_share("café — ＨＨ 什") == 0.0
    assert mean_word_length("the lamp  themnothinkbetter") == pytest.approx(24 / 3)


def test_scripts_settings() -> None:
    assert parse_scripts("any") == () and parse_scripts("AUTO") == ("auto",)
    assert parse_scripts("greek, latin") == ("greek", "latin")
    assert scripts_of("The lamp. Καλημέρα") == ("greek", "latin")
    assert scripts_of("灯台守") == ("cjk", "latin")
    with pytest.raises(ConfigError, match="unknown script klingon"):
        SamplingConfig(scripts=parse_scripts("latin,klingon"))
    sampling = SamplingConfig(temperature=1.0, scripts=("latin",))
    with pytest.raises(ConfigError, match="needs the tokenizer"):
        target_scores(torch.zeros(8), torch.tensor([1, 2]), sampling)
    with pytest.raises(ConfigError, match="resolved from the prefix"):
        with_scripts_filter(SamplingConfig(scripts=("auto",)), byte_level_tokenizer(), 400)
    bound = with_scripts_filter(SamplingConfig(scripts=("auto",)), byte_level_tokenizer(), 400, prefix="Καλημέρα, lamp")
    assert bound.scripts == ("greek", "latin") and bound.script_filter is not None
    assert bound == dataclasses.replace(bound, script_filter=None)  # the filter is not part of the settings
    recorded = RunConfig(max_new_tokens=8, sampling=bound).to_dict()["sampling"]
    assert recorded["scripts"] == ("greek", "latin") and "script_filter" not in recorded
    assert RunConfig.from_dict(RunConfig(max_new_tokens=8, sampling=bound).to_dict()).sampling == bound


def _vocabulary() -> list[bytes]:
    """A vocabulary for the tiny models: ASCII words, accented letters, lone UTF-8 bytes and CJK pieces."""
    pieces = [b" the", b" lamp", b"a", b".", b"\n", "é".encode(), "—".encode(), b"\xc3", b"\xa9", b"\xe2", b"\x80"]
    pieces += [FULLWIDTH_H[:2], FULLWIDTH_H[2:], "什".encode(), b"\xef", b"\xbc", b"\xf0\x9f", b"\x98", b"\x80"]
    return [pieces[i % len(pieces)] for i in range(VOCAB)]


@pytest.mark.parametrize("greedy", [True, False])
def test_tokenswift_equals_plain_under_the_filter_and_stays_in_the_script(family: str, greedy: bool) -> None:
    target = tiny_target(family)
    vocabulary = _vocabulary()
    heads, prompt = random_heads(target), [t for t in random_prompt(80) if vocabulary[t].isascii()]
    latin = ScriptFilter(("latin",), vocabulary, VOCAB)
    sampling = SamplingConfig(temperature=0.0 if greedy else 1.0, seed=3, scripts=("latin",), script_filter=latin)
    cfg = RunConfig(max_new_tokens=160, sampling=sampling)
    plain, _ = generate_tokens(target, None, prompt, cfg.replace(mode="plain"))
    fast, stats = generate_tokens(target, heads, prompt, cfg)
    free, _ = generate_tokens(target, None, prompt, cfg.replace(mode="plain", sampling=SamplingConfig(
        temperature=sampling.temperature, seed=3)))  # fmt: skip
    assert first_divergence(fast, plain) is None
    text = b"".join(vocabulary[t] for t in plain)
    written = text[: len(text) - len(pending_bytes(text))].decode()  # raises if the bytes are not UTF-8
    assert all(latin.alphabet.allows(ord(c)) for c in written)
    free_text = b"".join(vocabulary[t] for t in free)
    assert not all(
        latin.alphabet.allows(ord(c)) for c in free_text.decode(errors="replace")
    )  # the filter had work to do
    assert stats.iterations < 160
