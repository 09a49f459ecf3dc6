"""benchmarks/acceptance_bound.py: the replays that bound what any drafter can gain on a text."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "acceptance_bound.py"
_SPEC = importlib.util.spec_from_file_location("acceptance_bound", _PATH)
assert _SPEC is not None and _SPEC.loader is not None
bound = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(bound)


def test_oracle_replay_counts_root_plus_covered_positions() -> None:
    # ranks of the drawn tokens: a step at position p commits p, then p+1.. while they rank below the width
    ranks = [0, 0, 0, 7, 0, 2, 0, 0]
    assert bound.oracle_tokens_per_step(ranks, (1,)) == pytest.approx(8 / 5)  # steps at 0, 2, 3, 5, 7
    assert bound.oracle_tokens_per_step(ranks, (1, 1, 1)) == pytest.approx(8 / 3)  # 0-2, 3-4, 5-7
    assert bound.oracle_tokens_per_step(ranks, (3, 3, 3)) == pytest.approx(8 / 3)  # 0-2, 3-6, 7
    assert bound.oracle_tokens_per_step([5] * 6, (8, 8)) == pytest.approx(3.0)
    assert bound.oracle_tokens_per_step([5] * 6, ()) == pytest.approx(1.0)  # no drafts: plain decoding


def test_ngram_replay_finds_repeats_unless_the_lag_hides_them() -> None:
    tokens = [1, 2, 3, 4, 5, 6] * 10
    fast = bound.ngram_tokens_per_step(tokens, 6, size=4, top_k=1, lag=0)
    assert fast > 3.0  # after one period every continuation is in the table
    hidden = bound.ngram_tokens_per_step(tokens, 6, size=4, top_k=1, lag=len(tokens))
    assert hidden == pytest.approx(1.0)
    assert bound.ngram_tokens_per_step(list(range(50)), 5, size=4, top_k=4, lag=0) == pytest.approx(1.0)
