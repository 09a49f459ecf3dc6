"""The host's cost of an engine iteration on the CUDA code path (`bench/host_syncs.py`), counted on this CPU:
synchronisations and eager ops per iteration stay within budgets (upper bounds: on a CPU every tensor is
on the host). The budgets are today's counts: a change that adds a sync to the loop fails here. Before the
walk on the device (engine/walk.py) and the drafts' single read-back: plain 2 (greedy) and 5 (paper), draft pass
9 and 18 syncs per iteration, and 25 / 40 / 220 / 290 eager ops."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_model
from helpers import random_heads, random_prompt

from tokenswift_cli.backends.cuda.graphs import GRAPHS
from tokenswift_cli.backends.cuda.padded import FORCE
from tokenswift_cli.bench.host_syncs import counting
from tokenswift_cli.config import RunConfig, SamplingConfig
from tokenswift_cli.engine.decode import generate
from tokenswift_cli.engine.state import prefill
from tokenswift_cli.engine.walk import WALK
from tokenswift_cli.model.target import Target

PAPER = SamplingConfig(temperature=1.0, min_p=0.1, penalty=1.2, penalty_window=1024, seed=0)
ITERATIONS = 8
PROMPT = 1100  # past the sampler's 1,024-token window: the walk replays a graph (uncaptured here)


def per_iteration(sampling: SamplingConfig, mode: str, monkeypatch: pytest.MonkeyPatch) -> tuple[float, float, dict]:
    monkeypatch.setenv(FORCE, "1")
    monkeypatch.setenv(GRAPHS, "body")
    monkeypatch.setenv(WALK, "device")  # what a GPU runs
    target = Target(tiny_model("llama-gqa").to(torch.bfloat16))
    heads = random_heads(target).to(dtype=target.dtype) if mode == "tokenswift" else None
    cfg = RunConfig(max_new_tokens=60, sampling=sampling, mode=mode, prefill_chunk=64)
    if mode == "tokenswift":
        cfg = cfg.replace(draft=cfg.draft.drafting("pass"))
    state = prefill(target, random_prompt(PROMPT), cfg)
    steps = generate(target, heads, state, cfg)
    for _ in range(2):  # graphs' buffers, first captures
        next(steps)
    with counting() as counts:
        for _ in range(ITERATIONS):
            next(steps)
    return counts.total_syncs / ITERATIONS, counts.total_eager_ops / ITERATIONS, dict(counts.sync_ops)


@pytest.mark.parametrize(
    ("name", "sampling", "mode", "syncs", "ops"),
    [
        ("plain greedy", SamplingConfig(), "plain", 1, 30),  # the walk's read-back
        ("plain paper", PAPER, "plain", 1, 30),
        ("draft pass greedy", SamplingConfig(), "tokenswift", 2, 125),  # + the drafts' read-back
        ("draft pass paper", PAPER, "tokenswift", 2, 125),
    ],
)
def test_an_iteration_stays_within_its_host_budget(  # type: ignore[no-untyped-def]
    name, sampling, mode, syncs, ops, monkeypatch
) -> None:
    got_syncs, got_ops, by_op = per_iteration(sampling, mode, monkeypatch)
    assert got_syncs <= syncs, f"{name}: {got_syncs:.1f} syncs per iteration (budget {syncs}): {by_op}"
    assert got_ops <= ops, f"{name}: {got_ops:.1f} eager ops per iteration (budget {ops})"
    assert got_syncs >= 1  # the count sees the acceptance's read-back at least
