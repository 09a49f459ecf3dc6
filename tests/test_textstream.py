"""Incremental detokenization: the chunks add up to the decoded text, never split a character, do not
depend on how tokens are grouped, survive a checkpoint, and keep a bounded window."""

from __future__ import annotations

import random

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from tokenswift_cli.runs.textstream import HOLD, MAX_WINDOW, REPLACEMENT, StreamState, TextStream, tokenizer_decoder

TEXT = "Héllo wörld — naïve café, 日本語のテキスト, €5 and emoji 🙂🚀. The lighthouse keeper climbed. " * 4


@pytest.fixture(scope="module")
def byte_level() -> PreTrainedTokenizerFast:
    """A byte-level BPE (as GPT-2, SmolLM2): multi-byte characters split over several tokens."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=["<eos>"],
        show_progress=False,
    )  # fmt: skip
    tokenizer.train_from_iterator(["The lighthouse keeper climbed the stairs. " * 10], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<eos>")


def stream_all(decode, context: list[int], ids: list[int], chunk: int) -> tuple[list[str], StreamState]:  # type: ignore[no-untyped-def]
    stream = TextStream(decode, context)
    chunks = [stream.push(ids[i : i + chunk]) for i in range(0, len(ids), chunk)]
    return chunks, stream.state


@pytest.mark.parametrize("chunk", [1, 2, 5, 17])
def test_chunks_add_up_to_the_decoded_text(byte_level: PreTrainedTokenizerFast, chunk: int) -> None:
    decode = tokenizer_decoder(byte_level)
    context, ids = byte_level("Prefix: ")["input_ids"], byte_level(TEXT)["input_ids"]
    assert any(REPLACEMENT in decode([t]) for t in ids)  # some tokens do split characters
    chunks, _ = stream_all(decode, context, ids, chunk)
    assert "".join(chunks) == TEXT
    assert not any(REPLACEMENT in c for c in chunks)  # never half a character


def test_grouping_does_not_change_output_or_state(byte_level: PreTrainedTokenizerFast) -> None:
    decode = tokenizer_decoder(byte_level)
    ids = byte_level(TEXT)["input_ids"]
    one, state_one = stream_all(decode, [], ids, 1)
    many, state_many = stream_all(decode, [], ids, 7)
    assert "".join(one) == "".join(many) and state_one == state_many


def test_a_restored_stream_continues_identically(byte_level: PreTrainedTokenizerFast) -> None:
    decode = tokenizer_decoder(byte_level)
    ids = byte_level(TEXT)["input_ids"]
    for cut in range(0, len(ids), 3):
        stream = TextStream(decode)
        head = stream.push(ids[:cut])
        rest = TextStream(decode, state=stream.state).push(ids[cut:])
        assert head + rest == TEXT, cut


def test_random_tokens_lose_at_most_a_trailing_partial_character(byte_level: PreTrainedTokenizerFast) -> None:
    decode = tokenizer_decoder(byte_level)
    rng = random.Random(0)
    vocab = len(byte_level)
    for _ in range(100):
        ids = [rng.randrange(vocab) for _ in range(rng.randrange(1, 80))]
        out = TextStream(decode).push(ids)
        full = decode(ids)
        assert full.startswith(out)
        missing = full[len(out) :]
        assert len(missing) <= HOLD and set(missing) <= {REPLACEMENT}


def test_window_stays_small_even_on_invalid_bytes(byte_level: PreTrainedTokenizerFast) -> None:
    decode = tokenizer_decoder(byte_level)
    # U+0080 is the bytes C2 80: its last token is the byte 0x80, invalid however the text goes on.
    lone_continuation = byte_level("\u0080")["input_ids"][-1]
    assert decode([lone_continuation] * 4) == REPLACEMENT * 4
    stream = TextStream(decode)
    out = ""
    for i in range(500):
        out += stream.push([lone_continuation] if i % 50 else byte_level("word ")["input_ids"])
        assert len(stream.state.window) <= MAX_WINDOW + 1
    assert out.count(REPLACEMENT) >= 400 and "word" in out


def test_leading_space_rule_of_sentencepiece_decoders() -> None:
    """SentencePiece drops the space of the first token; the look-back keeps it where it belongs."""
    pieces = ["▁the", "▁light", "house", "▁keeper", "▁climbed", ",", "▁slowly"]

    def decode(ids: list[int]) -> str:
        return "".join(pieces[i] for i in ids).replace("▁", " ").removeprefix(" ")

    context = [0, 1, 2]
    ids = [3, 4, 5, 6] * 10
    for chunk in (1, 3):
        chunks, _ = stream_all(decode, context, ids, chunk)
        assert "".join(chunks) == decode(context + ids)[len(decode(context)) :]
        assert "".join(chunks).startswith(" keeper climbed, slowly keeper")
