"""Tokens per step of the paper's draft pass on a text, replayed: with heads, without, and the oracle bound.

Decoding is lossless, so a run commits the same text whatever it drafts, and a step accepts exactly
the longest path of its trie that the text continues (each position's token is drawn as plain
decoding draws it). A text sampled once from the target distribution therefore tells how many
tokens per step any drafter would commit on it: at each root the replay builds the trie the draft
pass would build (level 1: the base logits' top tokens; level i+1: head i's; n-gram continuations of
each level-1 token), walks it down the text, and moves on past the accepted tokens.

The draft pass reads the root's state on the partial cache, which holds every position while the
context is within its budget (4096 by default); the replay reads the full context, so it is the
engine's own draft up to that length. The oracle proposes the target's own top-w tokens at each
depth along the true path (benchmarks/acceptance_bound.py): no drafter of the tree's shape does
better, though the n-gram paths, beyond that shape, can lift a real draft above it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import torch
from transformers import LogitsProcessorList, MinPLogitsWarper, PreTrainedModel, SuppressTokensLogitsProcessor

from tokenswift_cli.config import DraftConfig, SamplingConfig
from tokenswift_cli.engine.candidates import candidate_trie
from tokenswift_cli.engine.drafters.base import Drafts
from tokenswift_cli.engine.ngram import NGramTable
from tokenswift_cli.model.heads import DraftHeads
from tokenswift_cli.model.loading import LoadedModel
from tokenswift_cli.sampling.defaults import PAPER
from tokenswift_cli.sampling.distribution import target_scores
from tokenswift_cli.train.data import WindowPenalty, read_states


@dataclass(frozen=True)
class Replay:
    """Tokens per step on one text. `lag`: the n-gram table leaves out the penalty window (the reference)."""

    prefix_tokens: int
    tokens: int  # generated tokens replayed
    heads: float  # the paper's draft pass with the heads
    no_heads: float  # the same pass without heads: level 1 and its n-gram continuations
    oracle: float  # the tree's shape filled with the target's own top tokens
    heads_no_lag: float
    no_heads_no_lag: float
    heads_every_root: float  # 1 + the mean accepted length over every position as a root: paired, less noisy
    no_heads_every_root: float
    drawn_top1: float  # share of positions whose drawn token is the target's top-1
    drawn_top3: float

    def to_dict(self) -> dict[str, float | int]:
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in asdict(self).items()}


def oracle_tokens_per_step(token_ranks: Sequence[int], widths: Sequence[int]) -> float:
    """Replay: each step commits its root plus the following positions the oracle tree covers."""
    steps = position = 0
    while position < len(token_ranks):
        accepted = 0
        while accepted < len(widths) and position + 1 + accepted < len(token_ranks):
            if token_ranks[position + 1 + accepted] >= widths[accepted]:
                break
            accepted += 1
        position += 1 + accepted
        steps += 1
    return len(token_ranks) / max(steps, 1)


@torch.no_grad()
def write_text(model: PreTrainedModel, prompt: Sequence[int], new_tokens: int, sampling: SamplingConfig) -> list[int]:
    """`prompt` and `new_tokens` tokens the model writes after it, drawn from the target distribution (greedy at
    temperature 0)."""
    processors = LogitsProcessorList([WindowPenalty(sampling.penalty or 1.0, sampling.penalty_window)])
    if sampling.suppress_token_ids:
        processors.insert(0, SuppressTokensLogitsProcessor(list(sampling.suppress_token_ids), device=str(model.device)))
    if sampling.min_p:
        processors.append(MinPLogitsWarper(sampling.min_p))
    torch.manual_seed(sampling.seed)
    draw = (
        {"do_sample": True, "temperature": sampling.temperature} if sampling.temperature > 0 else {"do_sample": False}
    )
    out = model.generate(  # type: ignore[operator]
        input_ids=torch.tensor([list(prompt)], device=model.device), max_new_tokens=new_tokens,
        min_new_tokens=new_tokens, top_k=None, top_p=None, logits_processor=processors, pad_token_id=0, **draw,
    )  # fmt: skip
    return [int(t) for t in out[0].tolist()]


@torch.no_grad()
def replay(
    model: PreTrainedModel,
    heads: DraftHeads | None,
    tokens: Sequence[int],
    start: int,
    *,
    sampling: SamplingConfig = PAPER,
    draft: DraftConfig | None = None,
) -> Replay:
    """Tokens per step on `tokens[start:]` (written after `tokens[:start]`) under `sampling`."""
    draft = draft or DraftConfig()
    pre_norm, post = read_states(model, torch.tensor(list(tokens)))  # [T, H] each
    lm_head = model.get_output_embeddings()
    ranks: list[int] = []
    level1: dict[int, tuple[int, ...]] = {}  # root position -> the base logits' top tokens after it
    for q in range(start, len(tokens)):  # the distribution each generated token was drawn from
        scores = target_scores(lm_head(post[q - 1]), _context(tokens, q, sampling, post.device), sampling)  # [vocab]
        ranks.append(int((scores > scores[tokens[q]]).sum()))
        level1[q - 1] = tuple(scores.topk(draft.tree[0]).indices.tolist())
    cached: dict[int, tuple[tuple[int, ...], ...]] = {}

    def with_heads(p: int) -> tuple[tuple[int, ...], ...]:
        if p not in cached:
            widths = draft.tree[1 : 1 + (heads.num_heads if heads is not None else 0)]
            states = heads(pre_norm[p]) if heads is not None else pre_norm[:0]  # [K, H]
            context = _context(tokens, p + 1, sampling, post.device)
            deeper = [target_scores(lm_head(row), context, sampling) for row in states[: len(widths)]]  # [vocab] each
            tops = [tuple(s.topk(w).indices.tolist()) for s, w in zip(deeper, widths, strict=True)]
            cached[p] = (level1[p], *tops)
        return cached[p]

    lag = sampling.penalty_window if sampling.penalty is not None else 0
    drafters = (("heads", with_heads), ("none", lambda p: (level1[p],)))
    rates = {
        (name, lagged): _tokens_per_step(tokens, start, levels, draft, lag=lag if lagged else 0)
        for name, levels in drafters
        for lagged in (True, False)
    }
    every = {name: _tokens_per_root(tokens, start, levels, draft, lag=lag) for name, levels in drafters}
    n = max(1, len(ranks))
    return Replay(
        prefix_tokens=start, tokens=len(ranks), heads=rates["heads", True], no_heads=rates["none", True],
        oracle=oracle_tokens_per_step(ranks, draft.tree), heads_no_lag=rates["heads", False],
        no_heads_no_lag=rates["none", False], heads_every_root=every["heads"], no_heads_every_root=every["none"],
        drawn_top1=sum(r < 1 for r in ranks) / n,
        drawn_top3=sum(r < 3 for r in ranks) / n,
    )  # fmt: skip


def _context(tokens: Sequence[int], q: int, sampling: SamplingConfig, device: torch.device) -> torch.Tensor:
    """The tokens before position `q` that the draw at `q` depends on (the penalty window)."""
    return torch.tensor(tokens[max(0, q - sampling.context_length) : q], dtype=torch.long, device=device)


def _tokens_per_step(
    tokens: Sequence[int], start: int, levels: Callable[[int], tuple[tuple[int, ...], ...]], draft: DraftConfig,
    *, lag: int,
) -> float:  # fmt: skip
    """Walk the text root by root: each step commits its root and the longest trie path the text continues."""
    table, root, steps = NGramTable(draft.ngram_size), start, 0
    while root < len(tokens):
        root += 1 + _accepted(tokens, root, levels, draft, table, lag=lag)
        steps += 1
    return (len(tokens) - start) / max(steps, 1)


def _tokens_per_root(
    tokens: Sequence[int], start: int, levels: Callable[[int], tuple[tuple[int, ...], ...]], draft: DraftConfig,
    *, lag: int,
) -> float:  # fmt: skip
    """1 + the accepted length averaged over every position as a root: what a step commits, free of which
    roots one walk happens to visit, so that two drafters compare on the same roots."""
    table = NGramTable(draft.ngram_size)
    roots = range(start, len(tokens))
    return 1 + sum(_accepted(tokens, root, levels, draft, table, lag=lag) for root in roots) / max(len(roots), 1)


def _accepted(
    tokens: Sequence[int], root: int, levels: Callable[[int], tuple[tuple[int, ...], ...]], draft: DraftConfig,
    table: NGramTable, *, lag: int,
) -> int:  # fmt: skip
    """Tokens after `root` that its trie accepts (`table` is brought up to what the engine has counted there)."""
    table.update(tokens, until=root - lag)
    if root + 1 >= len(tokens):
        return 0
    drafts = Drafts(levels=levels(root), ngram_top_k=draft.ngram_top_k)
    children = candidate_trie(tokens[root], drafts, table).children
    node = accepted = 0
    for token in tokens[root + 1 :]:
        child = children[node].get(token)
        if child is None:
            break
        node, accepted = child, accepted + 1
    return accepted


def replay_file(
    loaded: LoadedModel,
    heads: DraftHeads | None,
    text: str,
    *,
    prefix_tokens: int,
    new_tokens: int,
    sampling: SamplingConfig,
) -> Replay:
    """Tokens per step on what the model writes after the first `prefix_tokens` tokens of `text`."""
    if loaded.tokenizer is None:
        raise ValueError("reading a text file needs the model's tokenizer")
    prompt = loaded.tokenizer(text)["input_ids"][:prefix_tokens]
    tokens = write_text(loaded.model, prompt, new_tokens, sampling)
    return replay(loaded.model, heads, tokens, len(prompt), sampling=sampling)
