"""Perplexity by position: each token's negative log-likelihood under a model (nats; ppl = exp(nll)).

With a sliding `window` every token is scored from at least `window - stride` preceding tokens, at
positions below `window`: this measures local fluency and is comparable between runs of any length.
With `window=None` each token sees the whole text before it at its true position: this measures
whether the model (as loaded, e.g. with YaRN) copes with long contexts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from transformers import DynamicCache, PreTrainedModel

from tokenswift_cli.config import ContextWindow, RunConfig


@torch.no_grad()
def token_nll(
    model: PreTrainedModel,
    tokens: Sequence[int],
    *,
    window: int | None = 2048,
    stride: int = 1024,
    first: int = 1,
    context: ContextWindow | None = None,
) -> torch.Tensor:
    """NLL `[len(tokens) - first]` of tokens[first:] (first >= 1), each predicted from its prefix.

    `window` None: the whole prefix, processed in `stride`-sized chunks with a cache; with `context`,
    as the engine sees it under that context window (sinks + recent tokens).
    """
    if window is not None and not 0 < stride < window:  # each window's first scored token needs a token before it
        raise ValueError("the stride must be in (0, window)")
    ids = torch.tensor([int(t) for t in tokens], device=model.device)  # [n]
    first = max(1, first)
    if window is None and context is not None:
        return _nll_windowed(model, ids, stride, first, context)
    if window is None:
        return _nll_full(model, ids, stride, first)
    out: list[torch.Tensor] = []
    scored_until = first  # tokens before this one are scored already (or not wanted)
    for begin in range(0, ids.shape[0], stride):
        end = min(begin + window, ids.shape[0])
        if end > scored_until:
            out.append(_nll_span(model, ids[begin:end], max(scored_until - begin, 1), None))
            scored_until = end
        if end == ids.shape[0]:
            break
    return torch.cat(out) if out else torch.zeros(0)


def sampled_nll(
    model: PreTrainedModel,
    tokens: Sequence[int],
    spans: Sequence[tuple[int, int]],
    *,
    window: int = 2048,
    stride: int = 1024,
    first: int = 1,
) -> torch.Tensor:
    """`token_nll(model, tokens, window=window, ...)` inside `spans` ([start, end) of `tokens`), NaN elsewhere.

    Each span goes through the windows the whole scan would use for it (they begin at multiples of
    `stride`), so its values are the whole scan's at a fraction of the cost.
    """
    first = max(1, first)
    out = torch.full((max(len(tokens) - first, 0),), math.nan)
    for start, end in spans:
        start, end = max(start, first), min(end, len(tokens))
        if end <= start:
            continue
        # The scan scores token q in the first window that ends past q, from where the previous one ended:
        # begin where that window for `start` begins.
        begin = max(0, (start - (window - stride)) // stride * stride)
        nll = token_nll(model, tokens[begin:end], window=window, stride=stride, first=start - begin)
        out[start - first : end - first] = nll
    return out


def _nll_full(model: PreTrainedModel, ids: torch.Tensor, chunk: int, first: int) -> torch.Tensor:
    cache, out = DynamicCache(config=model.config), []
    for begin in range(0, ids.shape[0], chunk):
        end = min(begin + chunk, ids.shape[0])
        # Position p is predicted by the logits at p - 1: score this chunk's predictions of the next tokens.
        nll = _nll_span(model, ids[begin : min(end + 1, ids.shape[0])], 1, cache, feed=end - begin)
        keep = torch.arange(begin + 1, begin + 1 + nll.shape[0]) >= first  # [scored]
        out.append(nll[keep])
    return torch.cat(out)


def _nll_windowed(
    model: PreTrainedModel, ids: torch.Tensor, chunk: int, first: int, context: ContextWindow
) -> torch.Tensor:
    """Full-context NLL through the engine's forward and cache, under a context window."""
    from tokenswift_cli.engine.state import full_capacity, prefill_chunk
    from tokenswift_cli.model.cache import FullCache
    from tokenswift_cli.model.target import Target

    target = Target(model)
    cfg = RunConfig(max_new_tokens=ids.shape[0], prefill_chunk=chunk, window=context)
    chunk = prefill_chunk(cfg)
    cache = FullCache(target.num_layers, capacity=full_capacity(cfg, 0), window=context)
    out = []
    for begin in range(0, ids.shape[0] - 1, chunk):
        forward = target.forward(ids[begin : begin + chunk], cache)
        cache.commit(range(forward.hidden.shape[0]))
        cache.evict()
        targets = ids[begin + 1 : begin + 1 + chunk]  # [scored]
        logits = target.logits(forward.hidden[: targets.shape[0]])
        nll = torch.nn.functional.cross_entropy(logits, targets, reduction="none").cpu()
        out.append(nll[torch.arange(begin + 1, begin + 1 + nll.shape[0]) >= first])
    return torch.cat(out)


def _nll_span(
    model: PreTrainedModel, ids: torch.Tensor, skip: int, cache: DynamicCache | None, feed: int | None = None
) -> torch.Tensor:
    """NLL of ids[skip:] given ids before them; with `cache`, only ids[:feed] go through the model."""
    feed = ids.shape[0] if feed is None else feed
    start = cache.get_seq_length() if cache is not None else 0
    positions = torch.arange(start, start + feed, device=ids.device)[None]  # [1, feed]
    hidden = model.get_decoder()(  # type: ignore[no-untyped-call]
        input_ids=ids[None, :feed], position_ids=positions, past_key_values=cache, use_cache=cache is not None
    ).last_hidden_state[0]  # [feed, hidden]
    targets = ids[skip:]  # [scored]
    head = model.get_output_embeddings()  # type: ignore[no-untyped-call]
    logits = head(hidden[skip - 1 : skip - 1 + targets.shape[0]]).float()  # [scored, vocab]
    return torch.nn.functional.cross_entropy(logits, targets, reduction="none").cpu()
