"""Text quality metrics and `tokenswift eval`, on tiny models and hand-made texts."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from conftest import tiny_model
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from typer.testing import CliRunner

from tokenswift_cli.data import DEFAULT_TEXT
from tokenswift_cli.quality.perplexity import sampled_nll, token_nll
from tokenswift_cli.quality.report import evaluate, markdown
from tokenswift_cli.quality.text import (
    compression_ratio,
    distinct_n,
    distinct_windows,
    repeated_sentence_rate,
    sentences,
    stretches,
)

WORDS = ["<unk>", "the", "keeper", "lit", "lamp", "at", "dusk", "and", "sea", "was", "calm", "."]


def word_tokenizer() -> PreTrainedTokenizerFast:
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    from tokenizers import decoders

    backend.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>")


def hf_nll(model, tokens: list[int]) -> torch.Tensor:  # type: ignore[no-untyped-def]
    with torch.no_grad():
        logits = model(torch.tensor([tokens])).logits[0, :-1]
    return torch.nn.functional.cross_entropy(logits, torch.tensor(tokens[1:]), reduction="none")


def test_distinct_n() -> None:
    assert distinct_n([1, 2, 3, 4], 1) == 1.0
    assert distinct_n([1, 1, 1, 1], 1) == 0.25
    assert distinct_n([1, 2, 1, 2, 1], 2) == 0.5  # (1,2) (2,1) (1,2) (2,1)
    assert distinct_n([1], 2) == 1.0
    windows = distinct_windows(list(range(25)), size=10)
    assert [(w.start, w.end) for w in windows] == [(0, 10), (10, 20), (20, 25)]
    assert [(w.start, w.end) for w in distinct_windows(list(range(24)), size=10)] == [(0, 10), (10, 20)]


def test_sentences_and_repeats() -> None:
    text = "The keeper lit the lamp. He nodded. The sea was calm tonight!\\nThe keeper  lit the LAMP. Done."
    assert sentences(text.replace("\\n", "\n")) == [
        "the keeper lit the lamp.", "the sea was calm tonight!", "the keeper lit the lamp."
    ]  # fmt: skip
    assert repeated_sentence_rate(text.replace("\\n", "\n")) == pytest.approx(1 / 3)
    seen: set[str] = set()
    assert repeated_sentence_rate("The keeper lit the lamp.", seen) == 0.0
    assert repeated_sentence_rate("Then the keeper lit the lamp. The keeper lit the lamp.", seen) == 0.5
    assert repeated_sentence_rate("") == 0.0


def test_compression_ratio_rises_with_repetition() -> None:
    varied = " ".join(f"word{i * 7919 % 1000}" for i in range(400))
    assert compression_ratio("the lamp " * 400) > 3 * compression_ratio(varied)
    assert compression_ratio("") == 1.0


@pytest.mark.parametrize("window", [None, 64, 500], ids=["full", "window64", "window-covers-all"])
def test_token_nll_scores_every_token_once(window: int | None) -> None:
    model = tiny_model("llama-gqa", seed=1)
    tokens = torch.randint(2, 96, (150,), generator=torch.Generator().manual_seed(0)).tolist()
    reference = hf_nll(model, tokens)
    nll = token_nll(model, tokens, window=window, stride=32)
    assert nll.shape == (149,)
    seen = 149 if window is None or window >= 150 else window  # tokens scored with all of their prefix
    torch.testing.assert_close(nll[: seen - 1], reference[: seen - 1], atol=1e-4, rtol=1e-4)
    later = token_nll(model, tokens, window=window, stride=32, first=100)
    torch.testing.assert_close(later, nll[99:], atol=1e-4, rtol=1e-4)


def test_sliding_window_differs_from_full_context_only_past_the_window() -> None:
    model = tiny_model("llama-gqa", seed=1)
    tokens = torch.randint(2, 96, (200,), generator=torch.Generator().manual_seed(2)).tolist()
    full, sliding = token_nll(model, tokens, window=None, stride=64), token_nll(model, tokens, window=64, stride=16)
    torch.testing.assert_close(sliding[:63], full[:63], atol=1e-4, rtol=1e-4)
    assert not torch.allclose(sliding[100:], full[100:], atol=1e-3)
    with pytest.raises(ValueError, match="stride"):
        token_nll(model, tokens, window=16, stride=32)
    with pytest.raises(ValueError, match="stride"):
        token_nll(model, tokens, window=16, stride=16)  # a window's first token would have no context


@pytest.mark.parametrize(("window", "stride"), [(64, 16), (48, 47), (40, 24)])
def test_sampled_nll_is_the_whole_scan_inside_its_spans(window: int, stride: int) -> None:
    model = tiny_model("llama-gqa", seed=1)
    tokens = torch.randint(2, 96, (300,), generator=torch.Generator().manual_seed(3)).tolist()
    whole = token_nll(model, tokens, window=window, stride=stride, first=5)
    spans = [(0, 9), (37, 60), (150, 171), (290, 320)]  # one before `first`, one past the end
    sampled = sampled_nll(model, tokens, spans, window=window, stride=stride, first=5)
    inside = torch.zeros(295, dtype=torch.bool)
    for start, end in [(5, 9), (37, 60), (150, 171), (290, 300)]:
        inside[start - 5 : end - 5] = True
    assert sampled.shape == whole.shape and torch.isnan(sampled[~inside]).all()
    torch.testing.assert_close(sampled[inside], whole[inside], atol=1e-5, rtol=1e-5)


def test_full_context_under_a_context_window() -> None:
    from tokenswift_cli.config import ContextWindow

    model = tiny_model("llama-gqa", seed=1)
    tokens = torch.randint(2, 96, (200,), generator=torch.Generator().manual_seed(2)).tolist()
    full = token_nll(model, tokens, window=None, stride=64)
    wide = token_nll(model, tokens, window=None, stride=64, context=ContextWindow(size=1000))
    torch.testing.assert_close(wide, full, atol=1e-4, rtol=1e-4)  # the engine's forward = the stock one
    narrow = token_nll(model, tokens, window=None, stride=64, context=ContextWindow(size=32, sinks=4), first=10)
    torch.testing.assert_close(narrow[: 36 - 10], full[9:35], atol=1e-4, rtol=1e-4)  # within the span: the same
    assert narrow.shape == full[9:].shape and not torch.allclose(narrow[60:], full[69:], atol=1e-3)


def test_evaluate_by_position_with_a_context() -> None:
    tokenizer = word_tokenizer()
    model = tiny_model("llama-gqa", seed=1)  # vocab 96 covers the 12 words
    sentence = tokenizer("the keeper lit the lamp at dusk .")["input_ids"]
    tokens = sentence * 6  # 48 tokens, the same sentence six times
    context = tokenizer("and the sea was calm .")["input_ids"]
    report = evaluate(tokens, tokenizer, model, prefix=context, bucket=16, distinct_window=24, window=32, stride=8)
    reference = hf_nll(model, context + tokens)[len(context) - 1 :]
    assert [(b.start, b.end) for b in report.buckets] == [(0, 16), (16, 32), (32, 48)]
    assert report.buckets[0].nll == pytest.approx(float(reference[:16].mean()), abs=1e-4)
    assert report.repeated_sentences == pytest.approx(5 / 6)
    assert report.buckets[0].repeated_sentences == pytest.approx(1 / 2)  # 2 sentences in the first 16 tokens
    assert report.distinct[0].distinct[0] == pytest.approx(7 / 24)
    assert math.isclose(report.buckets[0].perplexity or 0, math.exp(report.buckets[0].nll or 0))
    assert report.buckets[0].word_length == pytest.approx(26 / 7) and report.buckets[0].foreign == 0.0
    assert report.stretches == () and report.degenerate is None  # shorter than one stretch
    table = markdown(report)
    assert "| 0-16 |" in table and "| all |" in table and "distinct-4" in table
    assert json.loads(json.dumps(report.to_dict()))["tokens"] == 48
    sampled = evaluate(tokens, tokenizer, model, prefix=context, bucket=16, window=32, stride=8, sample=5)
    whole = token_nll(model, context + tokens, window=32, stride=8, first=len(context))
    for bucket in sampled.buckets:
        assert bucket.nll == pytest.approx(float(whole[bucket.start : bucket.start + 5].mean()), abs=1e-5)
    assert sampled.nll == pytest.approx(float(torch.cat([whole[s : s + 5] for s in (0, 16, 32)]).mean()), abs=1e-5)


class CharTokenizer:
    """One token per character: stretches of 500 tokens are 500 characters."""

    def decode(self, ids: list[int]) -> str:
        return "".join(map(chr, ids))


def test_stretches_flag_loops_and_run_together_words_but_not_prose() -> None:
    prose = DEFAULT_TEXT
    text = prose.read_text(encoding="utf-8")[20_000:22_000] if prose.is_file() else None
    if text is None:  # the books live beside the repository; this varied text stands in without them
        text = " ".join(f"word{i} alpha{i * 7 % 13} beta{i * 11 % 17}" for i in range(200))[:2000]
    loop = ("whatever your destiny may be, your fate is forever. " * 10)[:500]
    joined = ("thelovedoneslavetheworldthelusedone " * 20)[:500]
    names = [word.strip(",.;:!?'") for word in text.split()]
    listed = "".join(f"{name.upper()}, {name[:3].upper()}...\n\n" for name in names if len(name) > 3)[:500]
    found = stretches([ord(c) for c in text[:1000] + loop + joined + listed + "tail"], CharTokenizer())
    assert [s.start for s in found] == [0, 500, 1000, 1500, 2000]  # the short tail is left out
    assert [s.degenerate for s in found] == [False, False, True, True, True]
    assert found[2].looping and not found[2].run_together and not found[2].listing
    assert found[3].run_together
    assert found[4].listing and not found[4].looping  # a list of varied names compresses like prose


def test_a_chant_is_degenerate_and_anaphora_in_prose_is_not() -> None:
    from tokenswift_cli.quality.text import chant_share

    chant = "Tomorrow answered your prayers. Tomorrow buried your dead. Tomorrow passed. Tomorrow woke you up. "
    assert chant_share(chant * 2) == 1.0
    # three clauses opening alike among others, as prose has them: under the threshold
    prose = (
        "The keeper rose early. The lamp was cold. The wind had dropped. Nothing else moved on the island that "
        "morning, which pleased him greatly as he climbed the long stair to the lantern room above the sea."
    )
    assert 0.2 < chant_share(prose) < 0.5
    assert chant_share("We went. They stayed. We left.") == 0.0  # not in a row
    book = DEFAULT_TEXT.read_text(encoding="utf-8")[20_000:20_500]
    words = DEFAULT_TEXT.read_text(encoding="utf-8")[30_000:40_000].split()
    varied = " ".join(f"Tomorrow {words[3 * i]} {words[3 * i + 1]}." for i in range(100))  # nothing to compress
    found = stretches([ord(c) for c in book + varied[:500]], CharTokenizer())
    assert [s.chanting for s in found] == [False, True] and [s.degenerate for s in found] == [False, True]
    assert not (found[1].looping or found[1].listing or found[1].run_together)  # only this measure sees it


def test_evaluate_without_model_skips_perplexity() -> None:
    tokenizer = word_tokenizer()
    tokens = tokenizer("the keeper lit the lamp .")["input_ids"]
    report = evaluate(tokens, tokenizer, None)
    assert report.nll is None and report.buckets[0].nll is None
    assert "| - | - |" in markdown(report)


def save_word_model(folder: Path) -> Path:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(WORDS), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(folder)
    word_tokenizer().save_pretrained(folder)
    return folder


def test_eval_command_on_a_file_and_on_a_run(tmp_path: Path) -> None:
    from tokenswift_cli.cli.app import app

    model = str(save_word_model(tmp_path / "m"))
    text = tmp_path / "text.txt"
    text.write_text("the keeper lit the lamp at dusk . " * 20, encoding="utf-8")
    runner = CliRunner()
    result = runner.invoke(app, ["eval", str(text), "-m", model, "--bucket", "64", "--window", "32", "--stride", "16"])
    assert result.exit_code == 0, result.output
    assert "| 0-64 |" in result.output and "over a sliding window of 32 tokens (stride 16)" in result.output
    run = tmp_path / "runs" / "run-001"
    run.mkdir(parents=True)
    (run / "settings.json").write_text("{}", encoding="utf-8")
    (run / "text.txt").write_text("the sea was calm . " * 30, encoding="utf-8")
    (run / "prefix.txt").write_text("the keeper lit the lamp .", encoding="utf-8")
    args = ["eval", "1", "-m", model, "--runs-dir", str(tmp_path / "runs"), "--json", "--full-context"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert (data["context_tokens"], data["tokens"], data["full_context"]) == (6, 150, True)
    assert (data["rope"], data["rope_factor"]) == ("yarn", 2.5)  # 156 positions > 64 trained
    sampled = runner.invoke(app, [*args[:-1], "--bucket", "64", "--sample", "16"])
    assert sampled.exit_code == 0, sampled.output
    assert json.loads(sampled.output)["judge_sample"] == 16
    both = runner.invoke(app, [*args, "--sample", "16"])
    assert both.exit_code == 2 and "leave out --full-context" in both.output
    missing = runner.invoke(app, ["eval", "run-009", "-m", model, "--runs-dir", str(tmp_path / "runs")])
    assert missing.exit_code == 2 and "no run named" in missing.output


def test_defaults_for_the_embedded_model_and_eos_suppression() -> None:
    from tokenswift_cli.config import SamplingConfig
    from tokenswift_cli.sampling.defaults import EMBEDDED, PAPER, default_sampling, suppressed_ids

    assert default_sampling() == EMBEDDED and default_sampling("some/model") == PAPER
    assert (EMBEDDED.penalty, EMBEDDED.penalty_window, EMBEDDED.min_p) == (1.1, 1024, 0.1)
    assert (EMBEDDED.dry_multiplier, EMBEDDED.scripts) == (1.5, ("auto",))
    sampling = SamplingConfig(temperature=1.0, suppress_token_ids=(7,))
    assert suppressed_ids(sampling, [2, 0, 2], stop_at_eos=False).suppress_token_ids == (0, 2, 7)
    assert suppressed_ids(sampling, [2, 0], stop_at_eos=True) == sampling


def test_suppressed_tokens_are_never_drawn_in_either_mode() -> None:
    import dataclasses

    from helpers import first_divergence, random_heads, random_prompt, tiny_target

    from tokenswift_cli.config import DraftConfig, RunConfig, SamplingConfig
    from tokenswift_cli.engine.decode import generate_tokens

    target = tiny_target("llama-gqa", seed=3)
    prompt = random_prompt(30, seed=1)
    base = SamplingConfig(temperature=1.0, min_p=0.05, penalty=1.1, penalty_window=32, seed=4)
    free, _ = generate_tokens(target, None, prompt, RunConfig(max_new_tokens=60, mode="plain", sampling=base))
    banned = tuple(sorted(set(free))[:5])  # tokens this run draws when nothing is suppressed
    sampling = dataclasses.replace(base, suppress_token_ids=banned)
    plain, _ = generate_tokens(target, None, prompt, RunConfig(max_new_tokens=60, mode="plain", sampling=sampling))
    draft = DraftConfig(partial_budget=48, sink_tokens=4, recent_window=16)
    fast, _ = generate_tokens(
        target, random_heads(target), prompt, RunConfig(max_new_tokens=60, sampling=sampling, draft=draft)
    )
    assert not set(banned) & set(plain)
    assert first_divergence(fast, plain) is None


def test_empty_text_has_no_perplexity() -> None:
    report = evaluate([], word_tokenizer(), tiny_model("llama-gqa", seed=1), prefix=[1, 2, 3])
    assert (report.tokens, report.nll, report.buckets, report.distinct) == (0, None, (), ())


def test_word_distinct_counts_english_and_other_words_per_window() -> None:
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "clean_distinct.py"
    spec = importlib.util.spec_from_file_location("clean_distinct", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    lexicon = {"the", "sea", "keeper's", "light"}
    words = ["The", "sea,", "the", "keeper's", "Ethnicreligion;", "light", "xq"] * 1000  # 7,000 words
    windows = module.word_distinct(" ".join(words), lexicon.__contains__)
    assert len(windows) == 7_000 // module.WORD_WINDOW
    english, other = windows[0]
    assert english == pytest.approx(4 / module.WORD_WINDOW)  # the, sea, keeper's, light: case and commas aside
    assert other == pytest.approx(2 / module.WORD_WINDOW)  # ethnicreligion, xq
