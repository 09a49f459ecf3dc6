"""The acceptance rule draws exactly from the target distribution (chi-square over many seeds)."""

from __future__ import annotations

import itertools

import torch

from tokenswift_cli.config import SamplingConfig
from tokenswift_cli.engine.tree import TreeBuilder
from tokenswift_cli.engine.verify import accept
from tokenswift_cli.sampling.distribution import choose, target_probs

V = 5
# A toy bigram "model": the next-token logits depend on the last token only.
BIGRAM = torch.tensor(
    [
        [2.0, 1.0, 0.5, 0.0, -1.0],
        [0.3, 0.1, 1.5, 1.0, 0.0],
        [1.0, 1.0, 1.0, 0.2, 0.1],
        [0.0, 2.5, 0.5, 0.5, 0.2],
        [1.2, 0.0, 0.3, 0.9, 0.6],
    ]
)
HISTORY = [3, 4, 2]
ROOT = 0


def build_trie():  # type: ignore[no-untyped-def]
    builder = TreeBuilder(ROOT)
    # Paths sharing prefixes, duplicates and unlikely drafts: the case the reference gets wrong.
    for path in [(0, 1, 2), (0, 1, 3), (0, 3), (1, 2, 2), (1, 2), (4,), (0, 1, 2), (2, 0, 0)]:
        builder.add(path)
    return builder.build()


def first_two_tokens(cfg: SamplingConfig) -> tuple[int, int]:
    tree = build_trie()
    logits = BIGRAM[tree.tokens]  # [nodes, V]: each node's next-token logits
    accepted = accept(tree, logits, HISTORY, cfg)
    emitted = [*accepted.tokens, accepted.next_root]
    if len(emitted) == 1:  # the walk stopped at the root: the next token comes from the next iteration
        context = torch.tensor([*HISTORY, ROOT, emitted[0]])
        emitted.append(choose(BIGRAM[emitted[0]], context, len(HISTORY) + 2, cfg))
    return emitted[0], emitted[1]


def exact_joint(cfg: SamplingConfig) -> torch.Tensor:
    joint = torch.zeros(V, V, dtype=torch.float64)
    first = target_probs(BIGRAM[ROOT], torch.tensor([*HISTORY, ROOT]), cfg)
    for a in range(V):
        second = target_probs(BIGRAM[a], torch.tensor([*HISTORY, ROOT, a]), cfg)
        joint[a] = first[a] * second
    return joint


def chi_square(cfg_for_seed, samples: int) -> tuple[float, int]:  # type: ignore[no-untyped-def]
    counts = torch.zeros(V, V, dtype=torch.float64)
    for seed in range(samples):
        a, b = first_two_tokens(cfg_for_seed(seed))
        counts[a, b] += 1
    expected = exact_joint(cfg_for_seed(0)) * samples
    cells = expected > 0
    assert counts[~cells].sum() == 0, "a token outside the target's support was emitted"
    stat = float(((counts[cells] - expected[cells]) ** 2 / expected[cells]).sum())
    return stat, int(cells.sum()) - 1


# Upper 0.1% points of the chi-square distribution, by degrees of freedom.
CRITICAL_0_001 = {24: 51.18, 19: 43.82, 14: 36.12}


def test_two_first_tokens_follow_the_target_with_penalty() -> None:
    def cfg(seed: int) -> SamplingConfig:
        return SamplingConfig(temperature=1.0, penalty=2.0, penalty_window=3, seed=seed)

    stat, dof = chi_square(cfg, 6000)
    assert stat < CRITICAL_0_001[dof], (stat, dof)


def test_two_first_tokens_follow_the_target_with_filters() -> None:
    def cfg(seed: int) -> SamplingConfig:
        return SamplingConfig(temperature=0.8, min_p=0.1, top_p=0.95, seed=seed)

    stat, dof = chi_square(cfg, 6000)
    assert stat < CRITICAL_0_001.get(dof, 60.0), (stat, dof)


def test_path_penalty_sees_the_candidates_ancestors() -> None:
    """The penalty at a node counts the tokens of the node's own path, not of another branch."""
    cfg = SamplingConfig(temperature=0.0, penalty=50.0, penalty_window=8)
    builder = TreeBuilder(ROOT)
    builder.add((1, 1))  # under 1, the model strongly prefers... token 1 again? no: penalty forbids it
    builder.add((1, 2))
    tree = builder.build()
    logits = torch.zeros(tree.size, V)
    logits[:, 1] = 5.0  # every node prefers token 1
    logits[:, 2] = 4.0
    accepted = accept(tree, logits, [3, 4], cfg)
    # At the root, 1 is not in the window: draw 1. At node "1", 1 is on the path: penalised, draw 2.
    assert accepted.tokens == (1, 2)
    assert list(itertools.islice(accepted.nodes, 2)) == [tree.children[0][1], tree.children[tree.children[0][1]][2]]
