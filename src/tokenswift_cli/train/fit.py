"""Training the draft heads with the base model frozen (TokenSwift step 1's heads, Medusa-style).

Only the heads train: the rows (pre-norm hidden states and what follows them, see `train.data`)
are computed once. Each step scores a batch against the model's own `lm_head`, restricted to the
tokens that occur in the batch's targets: the full 49K-token softmax would cost 10x more on a
CPU, and the tokens left out have next to no probability under the teacher. `evaluate` always
scores the full vocabulary, as the engine does. Everything runs on the `lm_head` weight's device;
with a state file the loop is resumable (train/resume.py).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import torch

from tokenswift_cli.model.heads import DraftHeads
from tokenswift_cli.train.data import Rows
from tokenswift_cli.train.resume import LoopState, load_state, run_key, save_state

Target = Literal["soft", "hard"]


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation settings. `target` soft: the model's own top-k distribution; hard: the token there.
    `chained`: head i reads head i-1's state (the reference), else every head reads the model's."""

    target: Target = "soft"
    chained: bool = True
    steps: int = 1500
    batch_size: int = 256
    lr: float = 2e-3
    warmup: int = 100
    weight_decay: float = 0.0
    seed: int = 0
    max_seconds: float | None = None  # wall-clock budget: stops early, the heads stay usable

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True)
class StepReport:
    """Progress after one step: running averages of the loss and of each head's top-1 accuracy."""

    step: int
    loss: float
    top1: tuple[float, ...]
    seconds: float


@dataclass(frozen=True)
class Accuracy:
    """Per-head top-1/top-3 accuracy against the text's tokens and against the model's own top token."""

    rows: int
    top1: tuple[float, ...]
    top3: tuple[float, ...]
    model_top1: tuple[float, ...]
    model_top3: tuple[float, ...]

    def to_dict(self) -> dict[str, object]:
        return {k: [round(x, 4) for x in v] if isinstance(v, tuple) else v for k, v in asdict(self).items()}


def lm_head_weight(model: torch.nn.Module) -> torch.Tensor:
    """The output projection `[vocab, hidden]` shared by the base model and every head."""
    head = model.get_output_embeddings()  # type: ignore[operator]
    return head.weight.detach().float()  # type: ignore[no-any-return]


def head_loss(
    heads: DraftHeads, weight: torch.Tensor, batch: Rows, target: Target
) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, per-head top-1 hits `[K]`) of a batch, the softmax restricted to the batch's tokens."""
    vocab = torch.unique(torch.cat([batch.teacher_ids.flatten().long(), batch.targets.flatten()]))  # [V']
    states = heads(batch.hidden.float())  # [B, K, H]
    logp = torch.log_softmax(states @ weight[vocab].T, dim=-1)  # [B, K, V']
    labels = torch.searchsorted(vocab, batch.targets)  # [B, K]
    if target == "soft":
        teacher = torch.softmax(batch.teacher_logp.float(), dim=-1)  # renormalised top-k [B, K, k]
        picked = logp.gather(-1, torch.searchsorted(vocab, batch.teacher_ids.long()))  # [B, K, k]
        loss = -(teacher * picked).sum(-1).mean()
    else:
        loss = -logp.gather(-1, labels[..., None]).mean()
    hits = (logp.argmax(-1) == labels).float().mean(0)  # [K]
    return loss, hits.detach()


def _lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up, then cosine decay to a tenth of the peak."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, progress))))


def train_heads(
    heads: DraftHeads,
    weight: torch.Tensor,
    rows: Rows,
    cfg: TrainConfig,
    *,
    on_step: Callable[[StepReport], None] | None = None,
    on_checkpoint: Callable[[int], None] | None = None,
    checkpoint_every: int = 250,
    state_file: Path | None = None,
) -> int:
    """Train `heads` in place on `rows` (on `weight`'s device); returns the number of steps done.

    Ctrl-C (KeyboardInterrupt) or the time budget ends training after the current step, leaving
    usable heads; `on_checkpoint` runs every `checkpoint_every` steps so a crash loses little.
    With `state_file`, a run continues from the state found there and saves its own at every
    checkpoint and when it stops early, so that interrupted and resumed it ends as it would have
    uninterrupted; a finished run removes it.
    """
    rows = rows.to(weight.device)
    optimizer = torch.optim.AdamW(heads.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    key = run_key({**cfg.to_dict(), "max_seconds": None, "rows": rows.size, "heads": heads.num_heads})
    if state_file is not None and state_file.is_file():
        loop = load_state(state_file, key, heads, optimizer)
    else:
        loop = LoopState.start(rows.size, heads.num_heads, cfg.seed)
    heads.train()
    start = time.monotonic()
    try:
        while loop.step < cfg.steps:
            _step(heads, weight, rows.take(loop.next_indices(cfg.batch_size)), optimizer, loop, cfg)
            elapsed = time.monotonic() - start
            if on_step is not None:
                on_step(StepReport(loop.step, loop.loss_avg, tuple(loop.top1_avg.tolist()), elapsed))
            if loop.step % checkpoint_every == 0:
                if state_file is not None:
                    save_state(state_file, key, loop, heads, optimizer)
                if on_checkpoint is not None:
                    on_checkpoint(loop.step)
            if cfg.max_seconds is not None and elapsed >= cfg.max_seconds:
                break
    except KeyboardInterrupt:
        pass  # the last completed step's weights stand
    heads.eval()
    if state_file is not None and loop.step < cfg.steps:
        save_state(state_file, key, loop, heads, optimizer)
    elif state_file is not None:
        state_file.unlink(missing_ok=True)
    return loop.step


def _step(
    heads: DraftHeads, weight: torch.Tensor, batch: Rows, optimizer: torch.optim.Optimizer, loop: LoopState,
    cfg: TrainConfig,
) -> None:  # fmt: skip
    """One optimizer step on `batch`; advances the loop's step and running averages."""
    for group in optimizer.param_groups:
        group["lr"] = _lr_at(loop.step, cfg)
    loss, hits = head_loss(heads, weight, batch, cfg.target)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    loop.step += 1
    decay = min(0.98, 1 - 1 / loop.step)  # a plain mean at first, then an exponential average
    loop.loss_avg = decay * loop.loss_avg + (1 - decay) * float(loss.detach())
    loop.top1_avg = decay * loop.top1_avg + (1 - decay) * hits.cpu()


@torch.no_grad()
def evaluate(heads: DraftHeads, weight: torch.Tensor, rows: Rows, *, chunk: int = 256) -> Accuracy:
    """Top-1/top-3 accuracy of each head over the full vocabulary, as the engine drafts."""
    heads.eval()
    k = heads.num_heads
    sums = torch.zeros(4, k, device=weight.device)
    for start in range(0, rows.size, chunk):
        batch = rows.take(torch.arange(start, min(rows.size, start + chunk))).to(weight.device)
        top3 = (heads(batch.hidden.float()) @ weight.T).topk(3, dim=-1).indices  # [B, K, 3]
        for i, labels in enumerate((batch.targets, batch.teacher_ids[..., 0].long())):
            hit = top3 == labels[..., None]  # [B, K, 3]
            sums[2 * i] += hit[..., 0].float().sum(0)
            sums[2 * i + 1] += hit.any(-1).float().sum(0)
    rates = (sums / max(1, rows.size)).tolist()
    return Accuracy(rows.size, *(tuple(r) for r in rates))


def split_by_position(rows: Rows, short: int = 512, long: int = 2048) -> dict[str, Rows]:
    """Rows at short (< `short`) and long (>= `long`) positions, and all of them."""
    index = torch.arange(rows.size)
    return {
        "all": rows,
        f"<{short}": rows.take(index[rows.positions < short]),
        f">={long}": rows.take(index[rows.positions >= long]),
    }
