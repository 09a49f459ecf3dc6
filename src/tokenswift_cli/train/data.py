"""Training data for the draft heads: pre-norm hidden states with the tokens and distributions that follow.

A row pairs the model's pre-norm last hidden state `h_t` at one position with what head i must
predict there: the token at t+2+i (hard target) and the model's own top-k distribution for that
token (soft target, computed with the true tokens in between). The base model is frozen, so rows
are computed once, under `no_grad`, and the heads train on them alone.

Rows come from self-distillation (text the model writes itself from varied prompts, with the
sampling settings users run) or from text files read teacher-forced.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import (
    LogitsProcessor,
    LogitsProcessorList,
    MinPLogitsWarper,
    PreTrainedModel,
    RepetitionPenaltyLogitsProcessor,
    SuppressTokensLogitsProcessor,
)

TOP_K = 16  # teacher tokens kept per position: min-p 0.1 leaves fewer than this almost always


@dataclass(frozen=True)
class Rows:
    """Training rows. N rows, K heads, k teacher tokens per target."""

    hidden: torch.Tensor  # [N, H] pre-norm hidden state (bfloat16 to halve memory)
    targets: torch.Tensor  # [N, K] token at position t+2+i
    teacher_ids: torch.Tensor  # [N, K, k] the model's top-k tokens for that position
    teacher_logp: torch.Tensor  # [N, K, k] their log-probabilities (float16)
    positions: torch.Tensor  # [N] absolute position t of the hidden state

    @property
    def size(self) -> int:
        return int(self.hidden.shape[0])

    @property
    def num_heads(self) -> int:
        return int(self.targets.shape[1])

    def take(self, index: torch.Tensor) -> Rows:
        return Rows(*(t[index.to(t.device)] for t in self._tensors()))

    def to(self, device: torch.device | str) -> Rows:
        return Rows(*(t.to(device) for t in self._tensors()))

    def _tensors(self) -> tuple[torch.Tensor, ...]:
        return (self.hidden, self.targets, self.teacher_ids, self.teacher_logp, self.positions)

    def save(self, path: Path) -> None:
        names = ("hidden", "targets", "teacher_ids", "teacher_logp", "positions")
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        save_file({n: t.contiguous() for n, t in zip(names, self._tensors(), strict=True)}, str(tmp))
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: Path) -> Rows:
        data = load_file(str(path))
        return cls(data["hidden"], data["targets"], data["teacher_ids"], data["teacher_logp"], data["positions"])

    @classmethod
    def concat(cls, parts: Sequence[Rows]) -> Rows:
        return cls(*(torch.cat(ts) for ts in zip(*(p._tensors() for p in parts), strict=True)))


def rows_from_sequence(
    tokens: torch.Tensor, hidden: torch.Tensor, top: tuple[torch.Tensor, torch.Tensor], *, offset: int, heads: int
) -> Rows:
    """Rows of one sequence: `hidden[r]` `[T, H]` is at the position of `tokens[r]` `[T+1]`, and
    `top[.][r]` `[T, k]` is the model's distribution for `tokens[r+1]`. `offset` is the position of `tokens[0]`."""
    count = hidden.shape[0] - heads  # the last rows lack a target for the deepest head
    if count <= 0:
        return empty_rows(hidden.shape[1], heads)
    rows = torch.arange(count)
    shifts = torch.arange(heads)
    targets = tokens[rows[:, None] + 2 + shifts]  # [N, K]
    teacher = rows[:, None] + 1 + shifts  # [N, K] rows of `top` that predict those tokens
    return Rows(
        hidden=hidden[:count].to(torch.bfloat16),
        targets=targets.long(),
        teacher_ids=top[0][teacher].int(),
        teacher_logp=top[1][teacher].half(),
        positions=rows + offset,
    )


def empty_rows(hidden: int, heads: int) -> Rows:
    return Rows(
        torch.empty(0, hidden, dtype=torch.bfloat16),
        torch.empty(0, heads, dtype=torch.long),
        torch.empty(0, heads, TOP_K, dtype=torch.int32),
        torch.empty(0, heads, TOP_K, dtype=torch.float16),
        torch.empty(0, dtype=torch.long),
    )


def top_logprobs(logits: torch.Tensor, k: int = TOP_K) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, log-probs) of the k most likely tokens, `[..., k]` each, from logits `[..., vocab]`."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    values, ids = logp.topk(k, dim=-1)
    return ids, values


@contextlib.contextmanager
def capture_last(model: PreTrainedModel) -> Iterator[list[tuple[torch.Tensor, torch.Tensor]]]:
    """Record (pre-norm hidden `[B, H]`, top-k of the logits) of the last position of every forward."""
    records: list[tuple[torch.Tensor, torch.Tensor]] = []
    pending: list[torch.Tensor] = []
    norm, lm_head = model.get_decoder().norm, model.get_output_embeddings()

    def keep_hidden(module: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> None:
        pending.append(args[0][:, -1].detach().float())

    def keep_logits(module: torch.nn.Module, args: object, out: torch.Tensor) -> None:
        records.append((pending.pop(), torch.stack(top_logprobs(out[:, -1]), dim=0)))

    handles = [norm.register_forward_pre_hook(keep_hidden), lm_head.register_forward_hook(keep_logits)]
    try:
        yield records
    finally:
        for handle in handles:
            handle.remove()


class WindowPenalty(LogitsProcessor):
    """TokenSwift's contextual penalty: the repetition penalty over the last `window` tokens only."""

    def __init__(self, penalty: float, window: int) -> None:
        self.inner = RepetitionPenaltyLogitsProcessor(penalty)
        self.window = window

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        return self.inner(input_ids[:, -self.window :], scores)  # type: ignore[arg-type]


@dataclass(frozen=True)
class DistillConfig:
    """How the model writes its own training text: sampling as users run it, end-of-text suppressed."""

    new_tokens: int = 1024
    batch_size: int = 16
    min_p: float = 0.1
    penalty: float = 1.2
    penalty_window: int = 1024
    seed: int = 0


@torch.no_grad()
def self_distill(
    model: PreTrainedModel,
    prompts: Sequence[list[int]],
    cfg: DistillConfig,
    *,
    heads: int,
    suppress: Sequence[int] = (),
    folder: Path | None = None,
    on_batch: Callable[[int], None] | None = None,
    deadline: float | None = None,
) -> Rows:
    """Rows from the model's own continuations of `prompts` (token ids), `cfg.batch_size` at a time.

    With `folder` (one per model), each batch's rows are saved there under a key of its prompts and
    settings, and reused by a later call: an interrupted run resumes where it stopped. Past
    `deadline` (`time.monotonic()`), no new batch is written: the rows so far are returned.
    """
    processors = LogitsProcessorList([WindowPenalty(cfg.penalty, cfg.penalty_window), MinPLogitsWarper(cfg.min_p)])
    if suppress:
        processors.insert(0, SuppressTokensLogitsProcessor(list(suppress), device=str(model.device)))
    parts = []
    for index, start in enumerate(range(0, len(prompts), cfg.batch_size)):
        batch = list(prompts[start : start + cfg.batch_size])
        path = folder / f"batch-{_batch_key(cfg, batch, index)}.safetensors" if folder is not None else None
        if path is not None and path.is_file():
            parts.append(Rows.load(path))
        elif deadline is not None and parts and time.monotonic() >= deadline:
            break
        else:
            torch.manual_seed(cfg.seed + index)
            parts.append(Rows.concat(_distill_batch(model, batch, cfg.new_tokens, processors, heads)))
            if path is not None:
                parts[-1].save(path)
        if on_batch is not None:
            on_batch(len(batch))
    return Rows.concat(parts) if parts else empty_rows(int(model.config.hidden_size), heads)


def _batch_key(cfg: DistillConfig, batch: list[list[int]], index: int) -> str:
    """Names a batch's cached rows by everything they depend on (the model is the folder's key)."""
    settings = (cfg.new_tokens, cfg.min_p, cfg.penalty, cfg.penalty_window, cfg.seed + index)
    return hashlib.sha256(json.dumps([settings, batch]).encode()).hexdigest()[:16]


def _distill_batch(
    model: PreTrainedModel, prompts: list[list[int]], new_tokens: int, processors: LogitsProcessorList, heads: int
) -> list[Rows]:
    width = max(len(p) for p in prompts)
    pad = 0
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=model.device)  # left padded [B, P]
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=model.device)
    with capture_last(model) as records:
        out = model.generate(  # type: ignore[operator]
            input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
            do_sample=True, temperature=1.0, top_k=None, top_p=None, logits_processor=processors, pad_token_id=pad,
        ).cpu()  # fmt: skip
    steps = len(records)
    hidden = torch.stack([h for h, _ in records], dim=1).cpu()  # [B, steps, H]
    top = torch.stack([t for _, t in records], dim=2).cpu()  # [2, B, steps, k]
    records.clear()  # the device's copies can go before the rows are cut
    rows = []
    for b, prompt in enumerate(prompts):
        tokens = out[b, width - 1 : width + steps]  # last prompt token, then the generated ones
        top_b = (top[0, b].long(), top[1, b])
        rows.append(rows_from_sequence(tokens, hidden[b], top_b, offset=len(prompt) - 1, heads=heads))
    return rows


@torch.no_grad()
def teacher_forced(model: PreTrainedModel, tokens: Sequence[int], *, heads: int, chunk: int = 512) -> Rows:
    """Rows of a text read by the model in one pass (all its positions): `tokens` starts at position 0."""
    ids = torch.tensor([list(tokens)])
    pre_norm, post = read_states(model, ids[0])
    lm_head = model.get_output_embeddings()
    parts = [[t.cpu() for t in top_logprobs(lm_head(post[i : i + chunk]))] for i in range(0, post.shape[0], chunk)]
    top = (torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts]))  # [T, k] each
    return rows_from_sequence(ids[0], pre_norm.cpu()[:-1], (top[0][:-1], top[1][:-1]), offset=0, heads=heads)


@torch.no_grad()
def read_states(model: PreTrainedModel, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(pre-norm, final) hidden states `[T, H]` of `tokens` `[T]` read in one pass, on the model's device."""
    hidden: list[torch.Tensor] = []
    norm = model.get_decoder().norm
    handle = norm.register_forward_pre_hook(lambda m, a: hidden.append(a[0][0].detach().float()))
    try:
        post = model.get_decoder()(input_ids=tokens[None].to(model.device)).last_hidden_state[0]  # [T, H]
    finally:
        handle.remove()
    return hidden[0], post
