"""CUDA graphs of the padded backend's forwards: a verification, or a draft pass, replayed by one launch.

On the H100 measured here (benchmarks/results/gpu-h100) the host took ~90 ms to launch a step whose GPU work
was ~7 ms (~1,600 launches). A graph replays a step's kernels reading its inputs from fixed device tensors, so all that
changes between steps lives there: the `rows` tokens and positions, how many keys the cache holds,
which of the step's rows see which. A step attends the cache's first `span` slots (`span` a multiple
of `SPAN_STEP`) under a mask: the held keys, the step's own rows as its tree allows, nothing past
them. A masked key's weight is exactly 0 (and it is finite: a new buffer's slots are zeroed), so the
sums are those of attending the visible keys alone.
Attention runs for the first `attending` rows only (1 for a plain step, up to `rows` for a tree:
`ATTENDING`), as the eager path's does for the real ones; the row-wise modules always run all
`rows`. One graph per (span, attending), captured the first time a step needs it, all sharing one
memory pool.

The draft pass (one token on the partial cache, TokenSwift step 1) gets graphs of its own, with the
fast attention: nothing compares its bits. Forwards of more tokens (prefill), under a context window,
with layers on several devices, or capturing another row's queries than the first run eagerly
(`padded.py`); a new or grown cache is captured again. `StepGraphs(..., capture=False)` runs the same
static-shape body without capturing: how the CPU tests check its arithmetic.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass

import torch
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from tokenswift_cli.backends.base import Backend
from tokenswift_cli.backends.cuda import layer_kernels
from tokenswift_cli.backends.cuda.attention_kernel import KERNEL_ROWS, kernel_attention
from tokenswift_cli.backends.cuda.float64_attention import float64_attention
from tokenswift_cli.model.cache import FullCache, PartialCache, _PreallocatedCache
from tokenswift_cli.model.forward import Forward, QueryCapture

SPAN_STEP = 1024  # keys attended per step, rounded up to this: at most 1,023 masked keys, one graph per 1K
ATTENDING = (1, 4, 16, 64)  # rows whose attention a graph computes (the forward's tokens, rounded up)
GRAPHS = "TOKENSWIFT_CUDA_GRAPHS"  # "0": none (every exact forward eager); "body": the body uncaptured, any device


Residual = torch.Tensor | None  # an addition to the residual stream not yet made (fused paths make it in the norm)


def rotated_projections(
    layer: torch.nn.Module, x: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor], *, fused: bool = False,
    delta: Residual = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """A layer's residual stream `x + delta`, then its (unrotated query, query, key, value) `[1, heads, rows, d]`.

    The padded backend's eager pieces and the graphs' body both take them from here: the same
    products in the same order, so a row's bits agree between the two paths. `fused`: the norm (with
    the add), one q/k/v product and the rotation through `layer_kernels`.
    """
    attn = layer.self_attn
    if fused:
        hidden, x = layer_kernels.rms_norm(layer.input_layernorm, x, delta)
        raw_query, key, value = layer_kernels.projections(attn, hidden)  # [1, rows, heads, d]
        query, key = layer_kernels.rotate(raw_query, *rotary), layer_kernels.rotate(key, *rotary)
        return x, raw_query.transpose(1, 2), query, key, value.transpose(1, 2)
    if delta is not None:
        x = x + delta
    hidden = layer.input_layernorm(x)
    by_head = (1, x.shape[1], -1, attn.head_dim)
    raw_query, key, value = (
        proj(hidden).reshape(by_head).transpose(1, 2) for proj in (attn.q_proj, attn.k_proj, attn.v_proj)
    )
    query, key = apply_rotary_pos_emb(raw_query, key, *rotary)
    return x, raw_query, query, key, value


def layer_output(
    layer: torch.nn.Module, x: torch.Tensor, attended: torch.Tensor, *, fused: bool
) -> tuple[torch.Tensor, Residual]:
    """The residual stream after a layer, as (`x`, an addition still to make): `x` plus the attention's
    projection of `attended` `[1, rows, heads * d]`, plus the MLP of that."""
    if not fused:
        x = x + layer.self_attn.o_proj(attended)
        return x + layer.mlp(layer.post_attention_layernorm(x)), None
    normed, x = layer_kernels.rms_norm(layer.post_attention_layernorm, x, layer.self_attn.o_proj(attended))
    return x, layer_kernels.mlp(layer.mlp, normed)


def final_norm(
    norm: torch.nn.Module, x: torch.Tensor, delta: Residual, *, fused: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """(pre-norm, post-norm) states of the residual stream `x + delta` after the last layer."""
    if fused:
        hidden, x = layer_kernels.rms_norm(norm, x, delta)
        return x, hidden
    x = x if delta is None else x + delta
    return x, norm(x)


def fast_attention(
    query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, visible: torch.Tensor, scaling: float
) -> torch.Tensor:
    """`[1, q, heads * d]`: queries `[1, heads, q, d]` over keys/values `[1, kv, n, d]`, `visible` `[q, n]`."""
    out = torch.nn.functional.scaled_dot_product_attention(
        query, keys.to(query.dtype), values.to(query.dtype), attn_mask=visible, scale=scaling, enable_gqa=True
    )  # [1, heads, q, d]
    return out.transpose(1, 2).reshape(1, query.shape[2], -1)


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph | None
    pre_norm: torch.Tensor  # [rows, hidden], overwritten by each replay
    hidden: torch.Tensor
    queries: torch.Tensor  # [layers, heads, head_dim]: the first row's rotated queries
    attended: torch.Tensor  # [1, rows, heads * head_dim]: the kernels write the attending rows, the rest stay 0


class StepGraphs:
    """A forward of at most `rows` tokens at fixed shapes, one CUDA graph per (span, attending).

    `exact`: the padded backend's verification (float64 attention, `rows` rows for the row-wise
    modules); otherwise the draft pass's one-token forward (fast attention, on the partial cache).
    """

    def __init__(self, backend: Backend, *, rows: int, exact: bool, capture: bool = True) -> None:
        self.backend, self.rows, self.exact, self.capture = backend, rows, exact, capture
        device = backend.device
        self.tokens = torch.zeros(rows, dtype=torch.long, device=device)
        self.positions = torch.zeros(rows, dtype=torch.long, device=device)
        self.stored = torch.zeros((), dtype=torch.long, device=device)
        self.tree_visible = torch.zeros(rows, rows, dtype=torch.bool, device=device)
        self.captured: dict[tuple[int, int], _Captured] = {}  # by (span, attending)
        self.buffers: list[weakref.ref[torch.Tensor]] = []  # the cache storage the graphs write into
        # Graphs only when every layer, the final norm and the head compute on the backend's device.
        places = {*backend.layer_devices, backend.output_device, backend.head_device}
        self.on_one_device = places == {device}
        self.pool = self.stream = None
        if capture:
            self.stream = torch.cuda.Stream(device)  # warm-up and capture on one stream
            self.pool = torch.cuda.graph_pool_handle()

    def covers(self, count: int, cache: _PreallocatedCache, capture: QueryCapture | None) -> bool:
        """Whether this forward can replay a graph (else the padded backend runs it eagerly)."""
        first = cache.layer_list[0]
        return (
            count <= self.rows
            and (isinstance(cache, PartialCache) or (isinstance(cache, FullCache) and cache.window is None))
            and first.keys is not None
            and first.stored + self.rows <= first.keys.shape[2]  # else the cache grows first (eagerly)
            and (capture is None or capture.row % count == 0)
            and self.on_one_device
        )

    def forward(
        self, tokens: torch.Tensor, positions: torch.Tensor, cache: _PreallocatedCache, block_mask: torch.Tensor,
        capture: QueryCapture | None,
    ) -> Forward:  # fmt: skip
        """Tokens `[q]` at `positions` `[q]` after the cache's held keys; `block_mask` `[q, q]`."""
        count, stored = tokens.shape[0], cache.layer_list[0].stored
        capacity = cache.layer_list[0].keys.shape[2]  # type: ignore[union-attr]
        span = min(math.ceil((stored + self.rows) / SPAN_STEP) * SPAN_STEP, capacity)
        attending = self._attending(count)
        if self.backend.kernel_attends(attending, exact=self.exact):  # they read the held count: one span
            span = capacity
        if not self._writes_into(cache):  # a new or grown cache: the graphs write into the old one
            self._drop_graphs()
            self.buffers = [weakref.ref(layer.values) for layer in cache.layer_list]  # type: ignore[arg-type]
            for layer in cache.layer_list:  # a never-written NaN stays NaN under a mask (NaN - inf, 0 x NaN)
                layer.keys[:, :, stored:].zero_()  # type: ignore[index]
                layer.values[:, :, stored:].zero_()  # type: ignore[index]
        pad = self.rows - count
        self.tokens.copy_(torch.nn.functional.pad(tokens, (0, pad)))
        self.positions.copy_(torch.cat([positions, positions[-1:].expand(pad)]))
        self.stored.fill_(stored)
        visible = torch.eye(self.rows, dtype=torch.bool, device=tokens.device)  # a pad row sees itself: no NaN
        visible[:count, :count] = block_mask
        self.tree_visible.copy_(visible)
        shape = (span, attending)
        captured = self.captured.get(shape) or self._capture(shape, cache)
        if captured.graph is not None:
            captured.graph.replay()
        else:
            self._body(shape, cache, captured)
        if capture is not None:
            capture.queries.update({i: q.clone() for i, q in enumerate(captured.queries)})
        return Forward(pre_norm=captured.pre_norm[:count].clone(), hidden=captured.hidden[:count].clone())

    def _attending(self, count: int) -> int:
        return min(next((q for q in ATTENDING if q >= count), self.rows), self.rows)

    def _writes_into(self, cache: _PreallocatedCache) -> bool:
        """Whether the graphs were captured on this cache's buffers (by identity: an address can be reused)."""
        return len(self.buffers) == len(cache.layer_list) and all(
            held() is layer.values for held, layer in zip(self.buffers, cache.layer_list, strict=True)
        )

    def _drop_graphs(self) -> None:
        """Forget every graph; later captures take a fresh pool.

        A pool lives while a graph holds it: capturing into the handle of one whose graphs are gone
        trips `use_count > 0` in CUDACachingAllocator (seen on an H200; vLLM #28426).
        """
        had_graphs = any(c.graph is not None for c in self.captured.values())
        self.captured.clear()
        if had_graphs:
            torch.cuda.synchronize(self.backend.device)
            self.pool = torch.cuda.graph_pool_handle()

    def _capture(self, shape: tuple[int, int], cache: _PreallocatedCache) -> _Captured:
        backend, device = self.backend, self.backend.device
        attn = backend.decoder.layers[0].self_attn
        heads = backend.model.config.num_attention_heads
        hidden_size = backend.decoder.embed_tokens.weight.shape[1]
        outputs = _Captured(
            None,
            torch.empty(self.rows, hidden_size, dtype=backend.dtype, device=device),
            torch.empty(self.rows, hidden_size, dtype=backend.dtype, device=device),
            torch.empty(len(backend.decoder.layers), heads, attn.head_dim, dtype=backend.dtype, device=device),
            torch.zeros(1, self.rows, heads * attn.head_dim, dtype=backend.dtype, device=device),
        )
        if self.capture:
            stream, current = self.stream, torch.cuda.current_stream(device)
            stream.wait_stream(current)
            with torch.cuda.stream(stream):
                self._body(shape, cache, outputs)  # warm-up: handles, workspaces, kernel choice, Triton builds
            stream.synchronize()
            outputs.graph = torch.cuda.CUDAGraph()
            local = "thread_local"  # another thread's CUDA work (a memory sampler, say) does not break the capture
            with torch.cuda.graph(outputs.graph, pool=self.pool, stream=stream, capture_error_mode=local):
                self._body(shape, cache, outputs)
            current.wait_stream(stream)
        self.captured[shape] = outputs
        return outputs

    def _body(self, shape: tuple[int, int], cache: _PreallocatedCache, out: _Captured) -> None:
        """The forward over `rows` rows, the first `attending` attending the first `span` cache slots."""
        (span, attending), backend, rows = shape, self.backend, self.rows
        x = backend.decoder.embed_tokens(self.tokens[None])  # [1, rows, hidden]
        rotary = backend.decoder.rotary_emb(x, self.positions[None])
        slots = self.stored + torch.arange(rows, device=x.device)  # where the step's keys go
        kernels = self.backend.kernel_attends(attending, exact=self.exact)  # (they read the tree themselves)
        if not kernels:
            relative = torch.arange(span, device=x.device) - self.stored  # slot - held keys
            own = (relative >= 0) & (relative < rows)
            tree = self.tree_visible[:attending, relative.clamp(0, rows - 1)]
            seen = (relative < 0)[None] | (own[None] & tree)  # [attending, span]
        fused = backend.fused_layers  # the draft pass too: nothing compares its bits, only its speed counts
        delta: Residual = None
        for index, layer in enumerate(backend.decoder.layers):
            attn, stored = layer.self_attn, cache.layer_list[index]
            x, _, query, key, value = rotated_projections(layer, x, rotary, fused=fused, delta=delta)
            out.queries[index].copy_(query[0, :, 0])
            assert stored.keys is not None and stored.values is not None
            stored.keys.index_copy_(2, slots, key.to(stored.keys.dtype))
            stored.values.index_copy_(2, slots, value.to(stored.values.dtype))
            keys, values = stored.keys[:, :, :span], stored.values[:, :, :span]
            if kernels:  # into the zero-padded buffer: no pad to launch
                padded = kernel_attention(
                    query[:, :, :attending], stored.keys, stored.values, self.stored,
                    tree_visible=self.tree_visible[:attending], scaling=attn.scaling, dot=attending > KERNEL_ROWS,
                    out=out.attended,
                )  # fmt: skip
            else:
                if self.exact:
                    attended = float64_attention(
                        query[:, :, :attending], keys, values, keys[:, :, :0], values[:, :, :0],
                        tree_visible=seen[:, :0], scaling=attn.scaling, cache_visible=seen,
                    )  # fmt: skip
                else:
                    attended = fast_attention(query[:, :, :attending], keys, values, seen, attn.scaling)
                padded = torch.nn.functional.pad(attended, (0, 0, 0, rows - attending))
            x, delta = layer_output(layer, x, padded, fused=fused)
        pre_norm, hidden = final_norm(backend.decoder.norm, x, delta, fused=fused)
        out.pre_norm.copy_(pre_norm[0])
        out.hidden.copy_(hidden[0])
