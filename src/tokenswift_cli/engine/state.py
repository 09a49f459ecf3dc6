"""The state of a generation and the method that keeps it consistent (TokenSwift steps 5 and 6)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from tokenswift_cli.config import ConfigError, RunConfig
from tokenswift_cli.engine.lookup import TextLookup
from tokenswift_cli.engine.metrics import Stats
from tokenswift_cli.engine.ngram import NGramTable
from tokenswift_cli.engine.verify import Acceptance
from tokenswift_cli.model import kv_rows, memory
from tokenswift_cli.model.cache import FullCache, PartialCache, _PreallocatedCache
from tokenswift_cli.model.target import QueryCapture, Target
from tokenswift_cli.sampling.distribution import choose

# Room in the full cache beyond the committed tokens for one verification forward.
TREE_HEADROOM = 512


@dataclass
class GenerationState:
    """Committed tokens (prefix included) with their keys/values, and the pending root."""

    tokens: list[int]
    prefix_length: int
    root: int
    full: FullCache
    partial: PartialCache | None
    ngrams: NGramTable
    stats: Stats = field(default_factory=Stats)
    eos_seen: bool = False
    lookup: TextLookup = field(default_factory=TextLookup)  # reads `tokens`: nothing to save

    @property
    def generated(self) -> list[int]:
        return self.tokens[self.prefix_length :]

    def finished(self, cfg: RunConfig) -> bool:
        return self.eos_seen or len(self.tokens) - self.prefix_length >= cfg.max_new_tokens

    def draft_cache(self) -> _PreallocatedCache:
        """The partial cache once the context outgrows its budget, the full cache before."""
        if self.partial is not None and self.partial.selected:
            return self.partial
        return self.full

    def commit(
        self, accepted: Acceptance, queries: Sequence[torch.Tensor], cfg: RunConfig, eos_ids: Sequence[int] = ()
    ) -> list[int]:
        """Keep the root and the accepted nodes; returns the newly committed tokens within the budget."""
        start = len(self.tokens)
        new = [self.root, *accepted.tokens]
        self.full.commit([0, *accepted.nodes])
        self.full.evict()
        self.tokens += new
        self.root = accepted.next_root
        self._refresh_partial(queries, cfg, start)
        lag = cfg.sampling.penalty_window if cfg.sampling.penalty is not None else 0
        self.ngrams.update(self.tokens, until=len(self.tokens) - lag)
        room = max(0, cfg.max_new_tokens - (start - self.prefix_length))
        emitted = new[:room]
        if cfg.stop_at_eos:
            for i, token in enumerate(emitted):
                if token in eos_ids:
                    emitted, self.eos_seen = emitted[: i + 1], True
                    break
        return emitted

    def _refresh_partial(self, queries: Sequence[torch.Tensor], cfg: RunConfig, start: int) -> None:
        partial, budget = self.partial, cfg.draft.partial_budget
        if partial is None or budget is None or self.full.length <= budget:
            return
        if partial.needs_refresh(self.full.length):
            partial.refresh(self.full, queries)
        else:
            partial.append(self.full, start, self.full.length)


def full_capacity(cfg: RunConfig, prefix_length: int) -> int:
    """Rows the full cache needs: the whole text, or with a context window what it holds at most."""
    needed, window = prefix_length + cfg.max_new_tokens + TREE_HEADROOM, cfg.context_window
    if window is None:
        return needed
    return min(needed, window.span + window.size // 4 + prefill_chunk(cfg) + TREE_HEADROOM)


def kv_storage(cfg: RunConfig, target: Target) -> torch.dtype:
    """The dtype the full cache stores keys and values in (`RunConfig.kv_cache`).

    "auto" is float16 where the native decoder runs (it reads float16 as fast as the half of the
    bytes it is: at long context a step is bound by them), the model's dtype elsewhere (the torch
    paths would widen a copy of the cache per forward). "int8" is `kv_rows.STORAGE`: 8-bit rows with
    their scales, on a CPU.
    """
    choice = cfg.kv_cache
    if choice == "auto":
        choice = "float16" if target.native is not None else "model"
    if choice == "model":
        return target.dtype
    if target.dtype != torch.float32:
        article = "an" if choice == "int8" else "a"
        raise ConfigError(f"{article} {choice} KV cache is for models computing in float32, not {target.dtype}")
    if choice == "int8":
        if target.device.type != "cpu":
            raise ConfigError("an int8 KV cache is for CPU runs (the GPU kernels read float caches)")
        config = target.model.config
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        if head_dim % kv_rows.GROUP:
            raise ConfigError(
                f"an int8 KV cache needs a head size that is a multiple of {kv_rows.GROUP}, not {head_dim}"
            )
        return kv_rows.STORAGE
    return torch.float16


def prefill_chunk(cfg: RunConfig) -> int:
    """Under a window, chunks no longer than the window: the sinks are cached before any row needs them."""
    window = cfg.context_window
    return cfg.prefill_chunk if window is None else min(cfg.prefill_chunk, window.size)


def uses_partial_cache(cfg: RunConfig) -> bool:
    """A context window bounds the draft pass's cost already: it drafts on the (windowed) full cache."""
    return cfg.mode == "tokenswift" and cfg.draft.partial_budget is not None and cfg.window is None


def prefill(target: Target, prompt: Sequence[int], cfg: RunConfig) -> GenerationState:
    """Process the prompt in chunks, then draw the first generated token (the first root)."""
    if not prompt:
        raise ValueError("the prefix must hold at least one token")
    tokens = [int(t) for t in prompt]
    _check_ids(tokens, target.model.get_input_embeddings().num_embeddings)
    if cfg.context_window is not None and not target.lean:
        raise ConfigError("a context window needs a llama, qwen2 or mistral model with full attention")
    full = FullCache(
        target.num_layers, full_capacity(cfg, len(tokens)), window=cfg.context_window, dtype=kv_storage(cfg, target)
    )
    stats = Stats()
    capture = QueryCapture(row=-1)
    with stats.phase("prefill", target.device):
        size = prefill_chunk(cfg)
        for start in range(0, len(tokens), size):
            chunk = torch.tensor(tokens[start : start + size])
            forward = target.forward(chunk, full, capture=capture)
            full.commit(range(chunk.shape[0]))
            full.evict()
        logits = target.logits(forward.hidden[-1])
    _check_ids(tokens, logits.shape[-1])  # the sampler's penalty indexes the scores with the context's ids
    context = torch.tensor(tokens[-cfg.sampling.context_length :])
    root = choose(logits, context, len(tokens), cfg.sampling)
    partial = None
    if uses_partial_cache(cfg):
        draft = cfg.draft
        partial = PartialCache(
            target.num_layers, budget=draft.partial_budget, sinks=draft.sink_tokens, window=draft.recent_window,
            dtype=target.dtype,
        )  # fmt: skip
    ngrams = NGramTable(cfg.draft.ngram_size)
    state = GenerationState(tokens, len(tokens), root, full, partial, ngrams, stats)
    lag = cfg.sampling.penalty_window if cfg.sampling.penalty is not None else 0
    ngrams.update(tokens, until=len(tokens) - lag)
    state._refresh_partial(capture.ordered(), cfg, start=len(tokens))
    memory.trim()  # the chunks' temporaries are not needed again
    return state


def _check_ids(tokens: Sequence[int], vocabulary: int) -> None:
    if max(tokens) >= vocabulary or min(tokens) < 0:
        bad = max(tokens) if max(tokens) >= vocabulary else min(tokens)
        raise ConfigError(f"the prefix holds token id {bad}, outside the model's vocabulary of {vocabulary}")
