"""The acceptance walk on the device: the trie walked level by level without a host synchronisation.

The host walk (`verify.accept`) reads each drawn token back to find the child that carries it, one
synchronisation per visited node (more at sampled settings). Here the walk stays on the device: each
level draws at the current node, finds the child with that token among the trie's nodes, and moves
there, the node index a device tensor throughout; the drawn tokens and whether each found a child
come back in one read. Levels past the walk's end are computed and ignored.

Every node's context (the history, then its path) is known before the walk, since the trie is: the
host prepares what the target's scores need per node (the filters' states, the uniform of each
depth). The logits of every node come from one call of the output head (a row's bits do not depend
on the rows beside it), and a level runs `target_scores`' ops on one node's row (`on_device.py`), so
the tokens are those of the host walk and of plain decoding, bit for bit (tests/test_walk.py). Once
the history fills what the scores read, the walk runs at fixed shapes (the trie padded to
`PAD_NODES` steps) and replays a CUDA graph (`backends/cuda/replay.py`).
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from tokenswift_cli.backends.cuda.replay import Replays
from tokenswift_cli.backends.transfer import upload
from tokenswift_cli.config import SamplingConfig
from tokenswift_cli.engine.tree import Tree
from tokenswift_cli.engine.verify import Acceptance, NodeLogits
from tokenswift_cli.sampling import distribution
from tokenswift_cli.sampling.distribution import filter_rules, position_uniform
from tokenswift_cli.sampling.on_device import MaskTable, scores_on_device

WALK = "TOKENSWIFT_WALK"  # "device" or "host"; unset: on the device wherever the model is not on the CPU
PAD_NODES = 16  # a graph's trie size is rounded up to this: a few graphs serve every trie


def walks_on_device(device: torch.device) -> bool:
    """Whether the acceptance walk runs on the device (the host walk is cheaper on a CPU: lazy shortcuts)."""
    choice = os.environ.get(WALK, "")
    return choice == "device" or (choice != "host" and device.type != "cpu")


def accept_on_device(tree: Tree, logits: NodeLogits, history: Sequence[int], cfg: SamplingConfig) -> Acceptance:
    """`verify.accept`, walked on the device: the same tokens, one host synchronisation."""
    target, device = logits.target, logits.hidden.device
    tail = list(history[-cfg.context_length :])
    levels = tree.max_depth + 1
    replays = Replays.of(target, device)
    static = replays.enabled and len(tail) == cfg.context_length  # else the context's length changes each time
    nodes = math.ceil(tree.size / PAD_NODES) * PAD_NODES if static else tree.size
    walk = _inputs(tree, logits.hidden, history, tail, levels, nodes, cfg)
    body = functools.partial(_walk, target=target, cfg=cfg, levels=levels)
    shape = ("walk", nodes, levels, len(tail), *(m.shape[0] for m in walk.masks))
    read, root = replays.run((shape, cfg), walk, body) if static else body(walk)
    logits.keep(0, root.clone())
    drawn, found = read.tolist()  # the one synchronisation
    path: list[int] = []
    node = 0
    for token, hit in zip(drawn, found, strict=True):
        if not hit:
            break
        node = tree.children[node][token]
        path.append(node)
    return Acceptance(
        nodes=tuple(path),
        tokens=tuple(tree.token_ids[n] for n in path),
        next_root=token,
        from_ngram=sum(tree.from_ngram[n] for n in path),
    )


@dataclass(frozen=True)
class _Walk:
    """One walk's inputs on the device. Padding nodes (parent -2) are never a child: the walk never reaches them."""

    hidden: torch.Tensor  # [nodes, hidden]
    tokens: torch.Tensor  # [nodes]
    parents: torch.Tensor  # [nodes]
    context: torch.Tensor  # [tail + 1]: the history's tail, then the root
    uniforms: torch.Tensor  # [levels] float64: the draws' uniforms, by depth
    xtc: torch.Tensor  # [levels] bool: whether XTC's coin picks that depth's position
    suppress: torch.Tensor  # [ids]
    masks: tuple[torch.Tensor, ...]  # per filter (scripts, spacing): its table of banned masks `[states, vocab]`
    rows: tuple[torch.Tensor, ...]  # ... and each node's row in it `[nodes]`

    def tensors(self) -> list[torch.Tensor]:
        return [self.hidden, self.tokens, self.parents, self.context, self.uniforms, self.xtc, self.suppress,
                *self.masks, *self.rows]  # fmt: skip

    def clone(self) -> _Walk:
        cloned = [tensor.clone() for tensor in self.tensors()]
        filters = len(self.masks)
        return _Walk(*cloned[:7], masks=tuple(cloned[7 : 7 + filters]), rows=tuple(cloned[7 + filters :]))


def _inputs(
    tree: Tree, hidden: torch.Tensor, history: Sequence[int], tail: list[int], levels: int, nodes: int,
    cfg: SamplingConfig,
) -> _Walk:  # fmt: skip
    device, pad = hidden.device, nodes - tree.size
    positions = [len(history) + 1 + depth for depth in range(levels)]
    masks, rows = [], []
    for rule, last in filter_rules(cfg):
        table = MaskTable.of(rule, device)
        node_rows = [table.row(context) for context in _node_contexts(tree, tail, last)]
        masks.append(table.masks)
        rows.append(upload(node_rows + [0] * pad, torch.long, device))
    return _Walk(
        hidden=torch.nn.functional.pad(hidden, (0, 0, 0, pad)) if pad else hidden,
        tokens=upload([*tree.token_ids, *[-1] * pad], torch.long, device),
        parents=upload([*tree.parents, *[-2] * pad], torch.long, device),
        context=upload([*tail, tree.token_ids[0]], torch.long, device),
        uniforms=upload([position_uniform(cfg.seed, p) for p in positions], torch.float64, device),
        xtc=upload([distribution.xtc_picks(p, cfg) for p in positions], torch.bool, device),
        suppress=upload(cfg.suppress_token_ids, torch.long, device),
        masks=tuple(masks),
        rows=tuple(rows),
    )


def _walk(walk: _Walk, *, target: Any, cfg: SamplingConfig, levels: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The walk at fixed shapes: (drawn tokens and whether each found a child `[2, levels]`, the root's logits)."""
    every_row = target.logits(walk.hidden)  # [nodes, vocab]: a row's bits whatever the batch (`Backend.logits`)
    node = torch.zeros(1, dtype=torch.long, device=every_row.device)
    context, drawn, found = walk.context, [], []
    for depth in range(levels):
        pairs = zip(walk.masks, walk.rows, strict=True)
        banned = [masks.index_select(0, rows.index_select(0, node))[0] for masks, rows in pairs]
        scores = scores_on_device(every_row.index_select(0, node)[0], context, cfg, walk.suppress, banned)
        if cfg.greedy:
            token = scores.argmax()[None]
        else:
            if cfg.xtc_probability is not None:  # the same bits as excluding only where the coin picks
                scores = torch.where(walk.xtc[depth], distribution.excluded_top_choices(scores, cfg), scores)
            token = distribution.inverse_cdf(scores, walk.uniforms[depth : depth + 1])
        match = (walk.parents == node) & (walk.tokens == token)  # [nodes]: the child carrying the token, if any
        found.append(match.any()[None])
        node = torch.where(found[-1], match.int().argmax()[None], node)
        drawn.append(token)
        context = torch.cat([context, token])
    return torch.stack([torch.cat(drawn), torch.cat(found).long()]), every_row[0]


def _node_contexts(tree: Tree, tail: list[int], last: int) -> list[list[int]]:
    """Per node, the last `last` tokens of its context: the history's tail, then its path from the root."""
    contexts: list[list[int]] = []
    for node, parent in enumerate(tree.parents):
        before = contexts[parent] if parent >= 0 else tail
        contexts.append([*before, tree.token_ids[node]][-last:])
    return contexts
