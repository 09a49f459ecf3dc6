"""Ranking the heads' logits as the target would draw: the top tokens of each row after the root's context.

Each depth's logits are scored under the target's processing (penalty, filters) after the root's
context, so the candidates look like the target's draws; their top tokens come back in one read. On
a GPU the scoring runs there (`sampling/on_device.py`) and, once the history fills what the scores
read, replays a CUDA graph (`backends/cuda/replay.py`): one launch for every row, where the host's
version launches a dozen per row. The ranking only proposes candidates: the text never depends on it.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from tokenswift_cli.backends.cuda.replay import Replays
from tokenswift_cli.backends.transfer import upload
from tokenswift_cli.config import SamplingConfig
from tokenswift_cli.engine.state import GenerationState
from tokenswift_cli.engine.walk import walks_on_device
from tokenswift_cli.model.target import Target
from tokenswift_cli.sampling.distribution import filter_rules, target_scores
from tokenswift_cli.sampling.on_device import MaskTable, scores_on_device

Rows = torch.Tensor | Sequence[torch.Tensor]  # logits `[rows, vocab]`


def rank(
    target: Target, logits: Rows, state: GenerationState, widths: Sequence[int], sampling: SamplingConfig
) -> tuple[tuple[int, ...], ...]:
    """Top-w tokens of each row of `logits` after the root's context (as many rows as both have)."""
    context = [*state.tokens[-sampling.context_length :], state.root]
    if walks_on_device(target.output_device):
        return _rank_on_device(target, logits, context, widths, sampling)
    return top_tokens(logits, torch.tensor(context, dtype=torch.long), widths, sampling)


def top_tokens(
    logits: Rows, context: torch.Tensor, widths: Sequence[int], sampling: SamplingConfig
) -> tuple[tuple[int, ...], ...]:
    """Top-w tokens of each row of `logits` under the target's processing after `context` (on the host)."""
    ranked = [
        target_scores(row, context, sampling).topk(width).indices for row, width in zip(logits, widths, strict=False)
    ]
    return _split(torch.cat(ranked).tolist() if ranked else [], [len(r) for r in ranked])


@dataclass(frozen=True)
class _Ranking:
    logits: torch.Tensor  # [rows, vocab]
    context: torch.Tensor  # [tail + 1]: the history's tail, then the root
    suppress: torch.Tensor  # [ids]
    banned: tuple[torch.Tensor, ...]  # per filter, its mask `[vocab]` after the context

    def tensors(self) -> list[torch.Tensor]:
        return [self.logits, self.context, self.suppress, *self.banned]

    def clone(self) -> _Ranking:
        logits, context, suppress, *banned = (tensor.clone() for tensor in self.tensors())
        return _Ranking(logits, context, suppress, tuple(banned))


def _rank_on_device(
    target: Target, logits: Rows, context: list[int], widths: Sequence[int], sampling: SamplingConfig
) -> tuple[tuple[int, ...], ...]:
    rows = logits if isinstance(logits, torch.Tensor) else torch.stack(list(logits))
    widths = tuple(widths[: rows.shape[0]])
    rows, device = rows[: len(widths)], rows.device
    banned = []
    for rule, last in filter_rules(sampling):
        table = MaskTable.of(rule, device)
        row = table.row(context[-last:])
        banned.append(table.masks[row])
    suppress = upload(sampling.suppress_token_ids, torch.long, device)
    inputs = _Ranking(rows, upload(context, torch.long, device), suppress, tuple(banned))
    body = functools.partial(_top, cfg=sampling, widths=widths)
    replays = Replays.of(target, device)
    if replays.enabled and len(context) == sampling.context_length + 1:
        (top,) = replays.run((("rank", widths, len(context)), sampling), inputs, body)
    else:
        (top,) = body(inputs)
    return _split(top.tolist(), widths)  # the one read-back


def _top(ranking: _Ranking, *, cfg: SamplingConfig, widths: tuple[int, ...]) -> tuple[torch.Tensor]:
    tops = [
        scores_on_device(row, ranking.context, cfg, ranking.suppress, ranking.banned).topk(width).indices
        for row, width in zip(ranking.logits, widths, strict=True)
    ]
    return (torch.cat(tops),)


def _split(flat: list[int], widths: Sequence[int]) -> tuple[tuple[int, ...], ...]:
    starts = [0, *itertools.accumulate(widths)]
    return tuple(tuple(flat[a:b]) for a, b in itertools.pairwise(starts))
