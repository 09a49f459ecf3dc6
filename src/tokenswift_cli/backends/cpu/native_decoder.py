"""Every decoder layer of a forward in one C++ call, for the engine's usual CPU model.

With 4-bit weights a plain step on a CPU spends ~0.5 ms per layer in Python and torch dispatch for
~75 small operations (norms, rotary embedding, reshapes, cache writes), a third of the step at 8K
context. `csrc/decoder.cpp` runs the same operations, on the same kernels where the result depends on
how they sum, so the bits are those of the model's own modules (tested against the Python lean
forward, itself tested against `generate()` on dense models). It applies where the lean forward
would take the row-attention kernel: float32 on a CPU, every projection 4-bit (q/k/v and gate/up
fused or not) or a GGUF file's blocks (`blocks.py`), the family's RMSNorm and SiLU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers.models.llama.modeling_llama import LlamaRMSNorm
from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm

from tokenswift_cli.backends.cpu import kernels
from tokenswift_cli.backends.cpu.blocks import BlockLinear
from tokenswift_cli.backends.cpu.int4 import Int4Linear
from tokenswift_cli.backends.cpu.row_attention import RowLayout
from tokenswift_cli.model.cache import PreallocatedLayer

_NORMS = (LlamaRMSNorm.forward, Qwen2RMSNorm.forward)


def _is_rms_norm(module: torch.nn.Module) -> bool:
    return type(module).forward in _NORMS


def _is_silu(module: torch.nn.Module) -> bool:
    return isinstance(module, torch.nn.SiLU) or type(module).__name__ == "SiLUActivation"


Quantised = Int4Linear | BlockLinear


def _projections(layer: Any) -> tuple[list[Quantised], list[Quantised]] | None:
    """The layer's quantised q/k/v and gate/up products (fused where int4.py fused them), or None."""
    attn, mlp = layer.self_attn, layer.mlp
    fused_qkv, fused_gate_up = getattr(attn, "qkv_int4", None), getattr(mlp, "gate_up_int4", None)
    qkv = [fused_qkv] if fused_qkv is not None else [attn.q_proj, attn.k_proj, attn.v_proj]
    gate_up = [fused_gate_up] if fused_gate_up is not None else [mlp.gate_proj, mlp.up_proj]
    parts = [*qkv, *gate_up, attn.o_proj, mlp.down_proj]
    if not all(isinstance(p, Quantised) for p in parts) or attn.o_proj.bias is not None:
        return None
    return qkv, gate_up


def supports(model: Any) -> bool:
    """Whether every layer computes what `decoder.cpp` computes (quantised projections, RMSNorm, SiLU)."""
    for layer in model.get_decoder().layers:  # type: ignore[operator]
        if _projections(layer) is None or not _is_silu(layer.mlp.act_fn):
            return False
        if not (_is_rms_norm(layer.input_layernorm) and _is_rms_norm(layer.post_attention_layernorm)):
            return False
    return True


def _native_layer(module: Any, layer: Any) -> object:
    """One layer's weights as `decoder.cpp` takes them."""
    projections = _projections(layer)
    assert projections is not None

    def native(linear: Quantised) -> object:
        if isinstance(linear, BlockLinear):
            return module.Blocks(linear.rows, int(linear.kind), linear.bias)
        return module.Int4(linear.packed, linear.scales, linear.lows, linear.bias, linear.out_features)

    qkv, gate_up = ([native(p) for p in group] for group in projections)
    o, down = native(layer.self_attn.o_proj), native(layer.mlp.down_proj)
    before, after = layer.input_layernorm, layer.post_attention_layernorm
    return module.Layer(
        before.weight.detach(), float(before.variance_epsilon), qkv, o,
        after.weight.detach(), float(after.variance_epsilon), gate_up, down,
    )  # fmt: skip


@dataclass
class NativeDecoder:
    """The compiled decoder (`kernels.load().Decoder`) of one model, with its shapes."""

    native: object
    heads: int
    kv_heads: int
    head_dim: int
    layers: int

    @classmethod
    def of(cls, model: Any) -> NativeDecoder | None:
        """The native decoder of `model`, or None where it does not apply or the kernels did not compile."""
        if not supports(model) or not kernels.available():
            return None
        module = kernels.load()
        config = model.config
        layers = model.get_decoder().layers  # type: ignore[operator]

        native_layers = [_native_layer(module, layer) for layer in layers]
        attn = layers[0].self_attn
        heads, kv_heads = config.num_attention_heads, config.num_key_value_heads or config.num_attention_heads
        native = module.Decoder(
            native_layers, heads, kv_heads, attn.head_dim, layers[0].mlp.down_proj.in_features, float(attn.scaling),
        )  # fmt: skip
        return cls(native=native, heads=heads, kv_heads=kv_heads, head_dim=attn.head_dim, layers=len(layers))

    def forward(
        self,
        x: torch.Tensor,
        rotary: tuple[torch.Tensor, torch.Tensor],
        sink_rotation: tuple[torch.Tensor, torch.Tensor] | None,
        caches: list[PreallocatedLayer],
        layout: RowLayout,
        capture_row: int | None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x `[1, q, hidden]` after every layer, and the captured queries `[layers, heads, d]` (if asked).

        The new keys and values are written into `caches` after their stored rows, as `update` does.
        """
        rows = x.shape[1]
        like = x.new_empty((1, self.kv_heads, 0, self.head_dim))
        for cache in caches:
            cache.make_room(rows, like)
        laid_out = [cache.tiles() for cache in caches]  # an 8-bit full cache's tiles (or an empty tensor)
        none = torch.empty(0)
        tiles = ([t[0] if t else none for t in laid_out], [t[1] if t else none for t in laid_out])
        cos, sin = (part[0].contiguous() for part in rotary)
        sink_cos, sink_sin = (part[0, 0].contiguous() for part in sink_rotation) if sink_rotation else (None, None)
        capture = None
        if capture_row is not None:
            capture_row %= rows
            capture = x.new_empty((self.layers, self.heads, self.head_dim))
        out = self.native.forward(  # type: ignore[attr-defined]
            x[0], cos, sin, sink_cos, sink_sin, [c.keys[0] for c in caches], [c.values[0] for c in caches],
            layout.stored, layout.lowest, layout.ancestors, layout.sinks, layout.offset, layout.committed,
            layout.block, -1 if capture_row is None else capture_row, capture, *tiles,
        )  # fmt: skip
        return out[None], capture
