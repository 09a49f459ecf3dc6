"""The padded backend: exact forwards at one row count, so plain decoding and a verified tree agree.

A GPU's products pick their kernel (tiles, split-K) from the whole shape, so a row's bits can
change with the number of rows beside it (vLLM RFC #54506). Here every exact forward (a plain step
is the verification of the root alone) runs its row-wise modules (projections, MLP, norms, the
output head) on exactly `rows` rows: the real ones, then padding. The same kernels run every step,
and a row's result depends on that row only. A tree of more nodes runs in pieces of `rows`, each
seeing the pieces before it as cached keys. Attention takes the real rows only: its result does
not depend on the kernels (`float64_attention.py`).

Written in torch ops, so the same code runs on a CPU (where the tests reach it) and on CUDA, where
`select.backend_for` takes it. Prefill and drafts keep the lean fast path: nothing compares them.
With `--device auto` the layers may sit on several devices: the residual stream, the rotary
tables and each layer's keys/values follow the layer.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel
from transformers.models.llama.modeling_llama import rotate_half

from tokenswift_cli.backends.cuda import attention_kernel, invariance, layer_kernels
from tokenswift_cli.backends.cuda.float64_attention import float64_attention
from tokenswift_cli.backends.cuda.graphs import (
    GRAPHS,
    Residual,
    StepGraphs,
    final_norm,
    layer_output,
    rotated_projections,
)
from tokenswift_cli.backends.lean import LeanBackend, Rotation, supports_lean
from tokenswift_cli.backends.placement import execution_device
from tokenswift_cli.backends.transfer import to_device
from tokenswift_cli.model.cache import FullCache, PreallocatedLayer, _PreallocatedCache
from tokenswift_cli.model.forward import Forward, QueryCapture

ROWS = 64  # rows of every exact forward: a 40-node tree and its n-gram paths fit one piece
LOGIT_ROWS = 16  # rows of every output-head product (the acceptance walk asks for at most this many)
FORCE = "TOKENSWIFT_PADDED"  # "1": take this backend on any device (tests, benchmarks on a CPU)
FUSED = "TOKENSWIFT_FUSED"  # "0": the layers' elementwise pieces as torch ops even where the kernels run
# Who computes the float64 rule: "kernel" (default on CUDA for bf16/fp16: Triton for forwards of at most
# KERNEL_ROWS rows, torch beyond), "kernel-dot" (Triton for all, on float64 tensor cores beyond), "torch".
ATTENTION = "TOKENSWIFT_ATTENTION"


def applies(model: PreTrainedModel) -> bool:
    """A CUDA model of a layout the lean forward knows, or any such model when `FORCE` is set."""
    on_cuda = execution_device(model.get_decoder().embed_tokens).type == "cuda"
    return supports_lean(model) and (on_cuda or os.environ.get(FORCE) == "1")


@dataclass(frozen=True)
class Piece:
    """What every layer needs to attend for one piece of an exact forward, on one device."""

    begin: int  # first row of the forward in this piece
    real: int  # rows of the piece that are tokens (the rest pad it to `rows`)
    stored: int  # cache rows held before the forward
    rotary: Rotation  # [1, rows, d] each
    sink_rotation: Rotation | None  # the sinks' rotation (context window only)
    tree_visible: torch.Tensor  # [real, begin + real]
    cache_visible: torch.Tensor | None  # [real, stored] (None: all)
    cache_sinks: int
    tree_sinks: torch.Tensor | None  # [begin + real]

    def to(self, device: torch.device) -> Piece:
        def move(value: torch.Tensor | None) -> torch.Tensor | None:
            return None if value is None else value.to(device)

        def turn(rotation: Rotation | None) -> Rotation | None:
            return None if rotation is None else (rotation[0].to(device), rotation[1].to(device))

        return Piece(
            self.begin, self.real, self.stored, turn(self.rotary), turn(self.sink_rotation),  # type: ignore[arg-type]
            self.tree_visible.to(device), move(self.cache_visible), self.cache_sinks, move(self.tree_sinks),
        )  # fmt: skip


class PaddedBackend(LeanBackend):
    """The lean layer loop; exact forwards at `rows` rows with kernel-independent attention."""

    def __init__(self, model: PreTrainedModel, *, rows: int = ROWS) -> None:
        super().__init__(model)
        invariance.configure(self.device)
        self.rows = rows
        # Float32 is left to the torch version: its products are not exact in float64, so the two could part.
        low_precision = self.dtype in (torch.bfloat16, torch.float16)
        default = "kernel" if self.device.type == "cuda" and low_precision else "torch"
        choice = os.environ.get(ATTENTION, default)
        self.kernel_attention = choice in ("kernel", "kernel-dot") and attention_kernel.available()
        self.dot_attention = self.kernel_attention and choice == "kernel-dot"  # many rows too: not yet timed
        if self.kernel_attention and self.device.type == "cuda":
            problem = attention_kernel.agrees(self.device, self.dtype)
            if problem is not None:
                warnings.warn(f"attention through torch: the Triton kernels are unusable ({problem})", stacklevel=2)
                self.kernel_attention = self.dot_attention = False
        if self.dot_attention and self.device.type == "cuda":  # a variant that does not build is never taken
            problem = attention_kernel.agrees(self.device, self.dtype, dot=True)
            if problem is not None:
                warnings.warn(f"many rows through torch: the tensor-core kernel is unusable ({problem})", stacklevel=2)
                self.dot_attention = False
        # The layers' norms, rotation and activation fused too, where the attention kernels run ("0": not).
        self.fused_layers = (
            attention_kernel.runs_on(self.device)
            and (self.device.type == "cuda" or os.environ.get(ATTENTION, "").startswith("kernel"))
            and os.environ.get(FUSED, "1") == "1"
            and all(layer_kernels.applies(layer) for layer in self.decoder.layers)
            and type(self.decoder.norm).__name__ in layer_kernels.NORMS
            and not any(p.device.type == "meta" for p in model.parameters())  # offloaded: nothing to join
        )
        if self.fused_layers and self.device.type == "cuda":
            problem = layer_kernels.usable(self.device, self.dtype)
            if problem is not None:
                warnings.warn(f"layers through torch ops: the fused kernels are unusable ({problem})", stacklevel=2)
                self.fused_layers = False
        mode = os.environ.get(GRAPHS, "1" if self.device.type == "cuda" else "0")
        rope_type = str(getattr(self.decoder.rotary_emb, "rope_type", "default"))
        if "dynamic" in rope_type or rope_type == "longrope":  # their tables change with the positions, on the host
            mode = "0"
        if any(p.device.type == "meta" for p in model.parameters()):  # offloaded: hooks copy weights in per call
            mode = "0"
        self.graphs = self.draft_graphs = None  # verification; the draft pass's one-token forward
        if mode != "0":
            self.graphs = StepGraphs(self, rows=rows, exact=True, capture=mode != "body")
            self.draft_graphs = StepGraphs(self, rows=1, exact=False, capture=mode != "body")

    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        cache: _PreallocatedCache,
        *,
        block_mask: torch.Tensor | None,
        capture: QueryCapture | None,
        exact: bool,
    ) -> Forward:
        """Exact: pieces of `rows` rows; otherwise the lean fast path."""
        if not exact:
            graphs = self.draft_graphs
            if graphs is not None and graphs.covers(tokens.shape[0], cache, capture):
                return graphs.forward(tokens, positions[0], cache, torch.ones(1, 1, dtype=torch.bool), capture)
            return super().forward(tokens, positions, cache, block_mask=block_mask, capture=capture, exact=False)
        count = tokens.shape[0]
        if block_mask is None:
            block_mask = torch.ones(count, count, dtype=torch.bool).tril()
        if self.graphs is not None and self.graphs.covers(count, cache, capture):
            return self.graphs.forward(tokens, positions[0], cache, to_device(block_mask, self.device), capture)  # type: ignore[arg-type]
        row = None if capture is None else capture.row % count
        parts = [
            self._piece(tokens, positions[0], cache, to_device(block_mask, self.device), begin, capture, row)
            for begin in range(0, count, self.rows)
        ]
        if len(parts) == 1:
            return parts[0]
        return Forward(pre_norm=torch.cat([p.pre_norm for p in parts]), hidden=torch.cat([p.hidden for p in parts]))

    def _piece(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        cache: _PreallocatedCache,
        block_mask: torch.Tensor,
        begin: int,
        capture: QueryCapture | None,
        row: int | None,
    ) -> Forward:
        end = min(begin + self.rows, tokens.shape[0])
        real, pad = end - begin, self.rows - (end - begin)
        padded = F.pad(tokens[begin:end], (0, pad))  # token 0 at the last real position: no row sees it
        where = torch.cat([positions[begin:end], positions[end - 1 : end].expand(pad)])  # [rows]
        x = self.decoder.embed_tokens(padded[None])  # [1, rows, hidden]
        piece = self._layout(x, where, positions[:end], cache, block_mask[begin:end, :end], begin)
        pieces = {x.device: piece}
        delta: Residual = None
        for index, (layer, device) in enumerate(zip(self.decoder.layers, self.layer_devices, strict=True)):
            x, delta = x.to(device), None if delta is None else delta.to(device)
            on_device = pieces.get(device) or pieces.setdefault(device, piece.to(device))
            keep = row - begin if row is not None and begin <= row < end else None
            x, delta = self._padded_layer(layer, x, delta, cache.layer_list[index], on_device, capture, keep)
        x, delta = x.to(self.output_device), None if delta is None else delta.to(self.output_device)
        fused = self.fused_layers and attention_kernel.runs_on(x.device)
        pre_norm, hidden = final_norm(self.decoder.norm, x, delta, fused=fused)
        return Forward(pre_norm=pre_norm[0, :real], hidden=hidden[0, :real])

    def _layout(
        self,
        x: torch.Tensor,
        where: torch.Tensor,
        seen: torch.Tensor,
        cache: _PreallocatedCache,
        tree_visible: torch.Tensor,
        begin: int,
    ) -> Piece:
        """Rotations and visibility of one piece (positions `where` `[rows]`; `seen`: of every new key so far)."""
        real = tree_visible.shape[0]
        rotary = self.decoder.rotary_emb(x, where[None])
        stored = cache.layer_list[0].stored
        window = cache.window if isinstance(cache, FullCache) else None
        if window is None:
            return Piece(begin, real, stored, rotary, None, tree_visible, None, 0, None)
        sink_rotation = self.decoder.rotary_emb(x, where.clamp(max=window.span - 1)[None])
        # Cache slot s holds position s among the sinks, s + dropped after them.
        slots = torch.arange(stored, device=where.device)
        held = slots + torch.where(slots >= window.sinks, cache.dropped, 0)
        lowest = (where[:real] - window.size + 1).clamp(min=window.sinks)  # [real]
        cache_visible = (held[None] < window.sinks) | (held[None] >= lowest[:, None])
        sinks = min(window.sinks, stored)
        return Piece(
            begin, real, stored, rotary, sink_rotation, tree_visible, cache_visible, sinks, seen < window.sinks
        )

    def _padded_layer(
        self,
        layer: torch.nn.Module,
        x: torch.Tensor,
        delta: Residual,
        cache: PreallocatedLayer,
        piece: Piece,
        capture: QueryCapture | None,
        keep: int | None,
    ) -> tuple[torch.Tensor, Residual]:
        """One decoder layer over `rows` rows (`x + delta`); attention over the real ones."""
        attn, rows = layer.self_attn, x.shape[1]
        kernels = attention_kernel.runs_on(x.device)  # not for a layer computing on the CPU beside a GPU
        fused = self.fused_layers and kernels
        x, raw_query, query, key, value = rotated_projections(layer, x, piece.rotary, fused=fused, delta=delta)
        if capture is not None and keep is not None:
            capture.queries[attn.layer_idx] = query[0, :, keep]
        # Pad rows write after the real ones: a later piece overwrites them, and no row sees them.
        slot = piece.stored + piece.begin
        cache.make_room(piece.begin + rows, key)
        assert cache.keys is not None and cache.values is not None
        cache.keys[:, :, slot : slot + rows].copy_(key)
        cache.values[:, :, slot : slot + rows].copy_(value)
        new_end = slot + piece.real  # the keys as stored (rounded to the storage dtype), as later steps read them
        real = slice(0, piece.real)
        sink_query = None
        if piece.sink_rotation is not None:
            cos, sin = piece.sink_rotation
            sink_query = (raw_query * cos[:, None] + rotate_half(raw_query) * sin[:, None])[:, :, real]
        if kernels and self.kernel_attends(piece.real):  # (the same bits as torch's)
            out = attention_kernel.kernel_attention(
                query[:, :, real], cache.keys, cache.values, piece.stored, tree_visible=piece.tree_visible,
                scaling=attn.scaling, cache_visible=piece.cache_visible, sink_query=sink_query,
                cache_sinks=piece.cache_sinks, tree_sinks=piece.tree_sinks,
                dot=piece.real > attention_kernel.KERNEL_ROWS,
            )  # fmt: skip
        else:
            out = float64_attention(
                query[:, :, real], cache.keys[:, :, : piece.stored], cache.values[:, :, : piece.stored],
                cache.keys[:, :, piece.stored : new_end], cache.values[:, :, piece.stored : new_end],
                tree_visible=piece.tree_visible, scaling=attn.scaling, cache_visible=piece.cache_visible,
                sink_query=sink_query, cache_sinks=piece.cache_sinks, tree_sinks=piece.tree_sinks,
            )  # fmt: skip
        return layer_output(layer, x, F.pad(out, (0, 0, 0, rows - piece.real)), fused=fused)

    def kernel_attends(self, rows: int, *, exact: bool = True) -> bool:
        """Few rows (a plain step, a draft pass) through the kernels; many only on float64 tensor cores, if chosen."""
        few = rows <= attention_kernel.KERNEL_ROWS
        return self.kernel_attention and (few or (exact and self.dot_attention))

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The output head in products of exactly `LOGIT_ROWS` rows (a row's logits whatever the batch)."""
        rows = hidden.to(self.head_device).reshape(-1, hidden.shape[-1])
        parts = [
            self.lm_head(F.pad(part, (0, 0, 0, LOGIT_ROWS - part.shape[0])))[: part.shape[0]].float()
            for part in rows.split(LOGIT_ROWS)
        ]
        logits = parts[0] if len(parts) == 1 else torch.cat(parts)
        return logits.reshape(*hidden.shape[:-1], -1)
