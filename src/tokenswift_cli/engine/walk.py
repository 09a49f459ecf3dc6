"""The acceptance walk on the device: the trie walked level by level without a host synchronisation.

The host walk (`verify.accept`) reads each drawn token back to find the child that carries it, one
synchronisation per visited node (more at sampled settings). Here the walk stays on the device: each
level draws at the current node, finds the child with that token among the trie's nodes, and moves
there, the node index a device tensor throughout; the drawn tokens and whether each found a child
come back in one read. Levels past the walk's end are computed and ignored.

Every node's context (the history, then its path) is known before the walk, since the trie is: the
host prepares what the target's scores need per node (the script and spacing states, the uniform of
each depth) while the device computes. The logits of every node come from one call of the output
head (a row's bits do not depend on the rows beside it), and a level runs `sampling.distribution`'s
own ops on one node's row, so the tokens are those of the host walk and of plain decoding, bit for
bit (tests/test_walk.py).
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Sequence
from typing import Any

import torch

from tokenswift_cli.backends.transfer import upload
from tokenswift_cli.config import SamplingConfig
from tokenswift_cli.engine.tree import Tree
from tokenswift_cli.engine.verify import Acceptance, NodeLogits
from tokenswift_cli.sampling import distribution
from tokenswift_cli.sampling.distribution import position_uniform

WALK = "TOKENSWIFT_WALK"  # "device" or "host"; unset: on the device wherever the model is not on the CPU


def walks_on_device(device: torch.device) -> bool:
    """Whether the acceptance walk runs on the device (the host walk is cheaper on a CPU: lazy shortcuts)."""
    choice = os.environ.get(WALK, "")
    return choice == "device" or (choice != "host" and device.type != "cpu")


def accept_on_device(tree: Tree, logits: NodeLogits, history: Sequence[int], cfg: SamplingConfig) -> Acceptance:
    """`verify.accept`, walked on the device: the same tokens, one host synchronisation."""
    hidden = logits.hidden
    device = hidden.device
    tokens, parents = tree.token_ids, tree.parents
    tail = list(history[-cfg.context_length :])
    levels = tree.max_depth + 1
    tokens_on, parents_on = upload(tokens, torch.long, device), upload(parents, torch.long, device)
    context = upload([*tail, tokens[0]], torch.long, device)  # grows by the drawn token each level
    uniforms = upload([position_uniform(cfg.seed, len(history) + 1 + d) for d in range(levels)], torch.float64, device)
    filters = _NodeFilters(tree, tokens, tail, cfg, device)
    every_row = logits.target.logits(hidden)  # [nodes, vocab]: a row's bits whatever the batch (`Backend.logits`)
    node = torch.zeros(1, dtype=torch.long, device=device)
    drawn, found = [], []
    for depth in range(levels):
        row = every_row.index_select(0, node)[0]
        if depth == 0:
            logits.keep(0, row)
        scores = filters.scores(row, node, context, cfg)
        if cfg.greedy:
            token = scores.argmax()[None]
        else:
            if distribution.xtc_picks(len(history) + 1 + depth, cfg):
                scores = distribution.excluded_top_choices(scores, cfg)
            token = distribution.inverse_cdf(scores, uniforms[depth : depth + 1])
        match = (parents_on == node) & (tokens_on == token)  # [nodes]: the child carrying the token, if any
        found.append(match.any()[None])
        node = torch.where(found[-1], match.int().argmax()[None], node)
        drawn.append(token)
        context = torch.cat([context, token])
    read = torch.cat([*drawn, *found]).tolist()  # the one synchronisation
    nodes: list[int] = []
    node_on_host = 0
    for token, hit in zip(read[:levels], read[levels:], strict=True):
        if not hit:
            break
        node_on_host = tree.children[node_on_host][token]
        nodes.append(node_on_host)
    return Acceptance(
        nodes=tuple(nodes),
        tokens=tuple(tokens[n] for n in nodes),
        next_root=token,
        from_ngram=sum(tree.from_ngram[n] for n in nodes),
    )


class _NodeFilters:
    """The parts of the target's scores that depend on the context, per trie node, ready on the device."""

    def __init__(self, tree: Tree, tokens: Sequence[int], tail: list[int], cfg: SamplingConfig, device: torch.device):
        self.suppress = upload(cfg.suppress_token_ids, torch.long, device) if cfg.suppress_token_ids else None
        self.masks: list[tuple[_MaskTable, torch.Tensor]] = []
        rules = ((cfg.script_filter if cfg.scripts else None, 4), (cfg.spacing_rule if cfg.spacing else None, 1))
        for rule, last in rules:
            if rule is None:
                continue  # a filter asked for but not attached fails in `target_scores` below, as on the host
            table = _MaskTable.of(rule, device)
            contexts = _node_contexts(tree, tokens, tail, last)
            self.masks.append((table, upload([table.row(rule.state(c)) for c in contexts], torch.long, device)))
        self.unfiltered = (cfg.scripts and cfg.script_filter is None) or (cfg.spacing and cfg.spacing_rule is None)

    def scores(self, row: torch.Tensor, node: torch.Tensor, context: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
        """`distribution.target_scores` for the node at `node` (`[1]`) after `context`, on the device."""
        if self.unfiltered:
            return distribution.target_scores(row, context, cfg)  # raises the one-line error
        scores = row.float().clone()
        if self.suppress is not None:
            scores.index_fill_(0, self.suppress, -float("inf"))
        for table, rows in self.masks:
            scores.masked_fill_(table.masks.index_select(0, rows.index_select(0, node))[0], -float("inf"))
        if cfg.dry_multiplier is not None:
            scores -= distribution.dry_penalties_on_device(context[-cfg.dry_range :], scores.shape[-1], cfg)
        return distribution.processed(scores, context[-cfg.penalty_window :], cfg)


def _node_contexts(tree: Tree, tokens: Sequence[int], tail: list[int], last: int) -> list[list[int]]:
    """Per node, the last `last` tokens of its context: the history's tail, then its path from the root."""
    contexts: list[list[int]] = []
    for node, parent in enumerate(tree.parents):
        before = contexts[parent] if parent >= 0 else tail
        contexts.append([*before, tokens[node]][-last:])
    return contexts


class _MaskTable:
    """A filter's banned masks `[states, vocab]` on one device, one row per state met so far (a few)."""

    _tables: weakref.WeakKeyDictionary[Any, dict[torch.device, _MaskTable]] = weakref.WeakKeyDictionary()

    def __init__(self, rule: Any, device: torch.device) -> None:
        self.rule, self.device = rule, device
        self.states: dict[Any, int] = {}
        self.masks = torch.zeros(0, 0, dtype=torch.bool, device=device)

    @classmethod
    def of(cls, rule: Any, device: torch.device) -> _MaskTable:
        """The table of `rule` on `device`, kept while the rule lives (a run's filters)."""
        per_device = cls._tables.setdefault(rule, {})
        if device not in per_device:
            per_device[device] = cls(rule, device)
        return per_device[device]

    def row(self, state: Any) -> int:
        if state not in self.states:
            mask = self.rule.banned_after(state).to(self.device)[None]
            self.masks = mask if not self.states else torch.cat([self.masks, mask])
            self.states[state] = len(self.states)
        return self.states[state]
