"""The acceptance walk on the device (engine/walk.py) draws the host walk's tokens, bit for bit, with one read-back."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch
from conftest import VOCAB as TINY_VOCAB
from helpers import first_divergence, random_heads, random_prompt, tiny_target

from tokenswift_cli.backends.cuda.graphs import GRAPHS
from tokenswift_cli.bench.host_syncs import counting
from tokenswift_cli.config import RunConfig, SamplingConfig
from tokenswift_cli.engine.decode import generate_tokens
from tokenswift_cli.engine.tree import TreeBuilder
from tokenswift_cli.engine.verify import NodeLogits, accept
from tokenswift_cli.engine.walk import WALK, accept_on_device
from tokenswift_cli.sampling.capitals import CapitalsRule
from tokenswift_cli.sampling.scripts import ScriptFilter
from tokenswift_cli.sampling.spacing import SpacingRule
from tokenswift_cli.sampling.whitespace import WhitespaceRule
from tokenswift_cli.sampling.word_length import WordLengthRule

VOCAB = 48
PIECES = [b" the", b"the", b",", b"!", b"a", b"B", b"\xc3", b"\xa9", "\uff28".encode()[:2], "\uff28".encode()[2:]]
PIECES += [b"  ", b"\n "]  # whitespace for the whitespace cap
PIECES += [bytes([97 + i % 26]) * (1 + i % 3) for i in range(VOCAB - len(PIECES))]


class RowTable:
    """An output head that returns a fixed row per node: hidden states are one-hot node ids."""

    def __init__(self, table: torch.Tensor) -> None:
        self.table = table  # [nodes, vocab], finite

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.table[hidden.argmax(-1)]


def random_case(rng: random.Random, generator: torch.Generator):  # type: ignore[no-untyped-def]
    builder = TreeBuilder(rng.randrange(VOCAB))
    for _ in range(rng.randrange(1, 12)):
        builder.add([rng.randrange(12) for _ in range(rng.randrange(1, 6))], from_ngram=rng.random() < 0.3)
    tree = builder.build()
    table = torch.randn(tree.size, VOCAB, generator=generator) * 2
    for node, children in enumerate(tree.children):  # children likely: the walks go deep
        for token in children:
            table[node, token] += rng.choice([0.0, 3.0, 6.0])
    history = [rng.randrange(12) for _ in range(rng.randrange(2, 60))]  # repeats: DRY and the penalty bite
    hidden = torch.eye(tree.size)
    return tree, NodeLogits(RowTable(table), tree, hidden), history  # type: ignore[arg-type]


CONFIGS = {  # short windows: most histories fill them, so the walks run at a graph's fixed shapes too
    "greedy": SamplingConfig(penalty_window=16),
    "greedy penalty": SamplingConfig(penalty=1.5, penalty_window=8),
    "paper": SamplingConfig(temperature=1.0, min_p=0.1, penalty=1.2, penalty_window=16, seed=3),
    "top-k top-p": SamplingConfig(temperature=0.7, top_k=6, top_p=0.9, penalty_window=16, seed=1),
    "dry suppress": SamplingConfig(
        temperature=1.0, dry_multiplier=0.8, dry_range=24, penalty_window=16, suppress_token_ids=(1, 5), seed=2
    ),
    "xtc": SamplingConfig(temperature=1.0, xtc_probability=0.5, xtc_threshold=0.05, penalty_window=16, seed=4),
    "greedy xtc": SamplingConfig(xtc_probability=0.9, xtc_threshold=0.05, penalty_window=16),  # greedy ignores XTC
    "scripts spacing": SamplingConfig(
        temperature=1.3, min_p=0.05, penalty=1.1, penalty_window=16, scripts=("latin",), spacing=True, seed=5,
        script_filter=ScriptFilter(("latin",), PIECES, VOCAB), spacing_rule=SpacingRule(PIECES, VOCAB),
    ),
    "word cap": SamplingConfig(
        temperature=1.3, min_p=0.05, penalty=1.1, penalty_window=16, max_word=4, seed=6,
        word_rule=WordLengthRule(PIECES, VOCAB, 4),
    ),
    "capitals cap": SamplingConfig(
        temperature=1.3, min_p=0.05, penalty=1.1, penalty_window=16, max_capitalised=1, seed=7,
        capitals_rule=CapitalsRule(PIECES, VOCAB, 1),
    ),
    "whitespace cap": SamplingConfig(
        temperature=1.3, min_p=0.05, penalty=1.1, penalty_window=16, max_spaces=2, seed=8,
        spaces_rule=WhitespaceRule(PIECES, VOCAB, 2),
    ),
}  # fmt: skip


@pytest.mark.parametrize("graphs", ["0", "body"], ids=["eager", "graph-body"])
@pytest.mark.parametrize("name", CONFIGS)
def test_the_device_walk_draws_the_host_walks_tokens(name: str, graphs: str, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Eagerly, and as a graph runs it: the trie padded to a graph's size once the history fills the window."""
    monkeypatch.setenv(GRAPHS, graphs)
    cfg, rng, generator = CONFIGS[name], random.Random(name), torch.Generator().manual_seed(len(name))
    deepest = 0
    for _ in range(40):
        tree, logits, history = random_case(rng, generator)
        host = accept(tree, logits, history, cfg)
        device = accept_on_device(tree, logits, history, cfg)
        assert device == host, f"{name}: host {host}, device {device}"
        deepest = max(deepest, len(host.nodes))
    assert deepest >= 2  # the cases reach below the first level


def test_the_device_walk_reads_back_once() -> None:
    rng, generator = random.Random(0), torch.Generator().manual_seed(0)
    for cfg in CONFIGS.values():
        tree, logits, history = random_case(rng, generator)
        with counting() as counts:
            accept_on_device(tree, logits, history, cfg)
        assert counts.total_syncs == 1, f"{cfg}: {dict(counts.sync_ops)}"


@pytest.mark.parametrize(
    "sampling",
    [
        SamplingConfig(),
        SamplingConfig(temperature=1.0, min_p=0.1, penalty=1.2, penalty_window=64, seed=0),
        SamplingConfig(temperature=1.0, min_p=0.05, dry_multiplier=0.8, dry_range=96, seed=4),
    ],
    ids=["greedy", "paper", "dry"],
)
def test_tokenswift_walked_on_the_device_equals_plain(sampling: SamplingConfig, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    target = tiny_target("llama-gqa")
    heads, prompt = random_heads(target), random_prompt(120)
    cfg = RunConfig(max_new_tokens=120, sampling=sampling)
    monkeypatch.setenv(WALK, "host")
    plain, _ = generate_tokens(target, None, prompt, cfg.replace(mode="plain"))
    monkeypatch.setenv(WALK, "device")
    fast, stats = generate_tokens(target, heads, prompt, cfg)
    plain_on_device, _ = generate_tokens(target, None, prompt, cfg.replace(mode="plain"))
    assert first_divergence(fast, plain) is None and plain_on_device == plain
    assert stats.iterations < len(plain)  # drafts were accepted


def test_a_filter_missing_its_tokenizer_fails_the_same_way_on_the_device() -> None:
    rng, generator = random.Random(1), torch.Generator().manual_seed(1)
    tree, logits, history = random_case(rng, generator)
    cfg = dataclasses.replace(CONFIGS["paper"], scripts=("latin",))
    with pytest.raises(ValueError, match="needs the tokenizer"):
        accept_on_device(tree, logits, history, cfg)


@pytest.mark.parametrize("bad", [TINY_VOCAB, -1])
def test_a_prefix_past_the_vocabulary_is_refused_in_one_line(bad: int) -> None:
    from tokenswift_cli.config import ConfigError
    from tokenswift_cli.engine.state import prefill

    target = tiny_target("llama-gqa")
    with pytest.raises(ConfigError, match=f"token id {bad}, outside the model's vocabulary"):
        prefill(target, [1, 2, bad], RunConfig(max_new_tokens=4))


@pytest.mark.parametrize("graphs", ["0", "body"], ids=["eager", "graph-body"])
def test_the_drafts_ranked_on_the_device_are_the_hosts(graphs: str, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from types import SimpleNamespace

    from tokenswift_cli.engine.drafters.ranking import rank, top_tokens

    monkeypatch.setenv(GRAPHS, graphs)
    monkeypatch.setenv(WALK, "device")
    rng, generator = random.Random(7), torch.Generator().manual_seed(7)
    model = RowTable(torch.zeros(1, VOCAB))  # a target's stand-in: only its device and identity are read
    model.output_device = torch.device("cpu")  # type: ignore[attr-defined]
    for name, cfg in CONFIGS.items():
        for _ in range(10):
            rows = torch.randn(rng.randrange(1, 5), VOCAB, generator=generator) * 3
            state = SimpleNamespace(
                tokens=[rng.randrange(12) for _ in range(rng.randrange(2, 60))], root=rng.randrange(VOCAB)
            )
            widths = [rng.randrange(1, 6) for _ in range(4)]
            context = torch.tensor([*state.tokens[-cfg.context_length :], state.root])
            assert rank(model, rows, state, widths, cfg) == top_tokens(rows, context, widths, cfg), name  # type: ignore[arg-type]
