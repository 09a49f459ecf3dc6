"""What an engine iteration costs the host on a GPU, counted on any device: host synchronisations and eager ops.

On CUDA each `.item()`, `bool(t)`, `int(t)`, `.tolist()`, `nonzero`, boolean indexing or device-to-host
copy blocks the host until the GPU catches up, and each op outside a CUDA graph is a launch the host
pays for. A `TorchDispatchMode` sees every ATen op on any device, so running the padded backend's code
path on a CPU (graph bodies uncaptured, their ops not counted: a graph replays them in one launch)
counts them per iteration and per phase of the loop (`Stats.phase`). `.tolist()` does not dispatch: it
is counted by patching it for the duration. On a CPU every tensor is on the host, so a sync counted
here is one on a GPU only where the tensor would live on the device: an upper bound.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tokenswift_cli.backends.cuda import graphs
from tokenswift_cli.backends.cuda.replay import Replays
from tokenswift_cli.engine import metrics

FREE = frozenset({  # ops that launch no kernel: views, metadata, aliasing, host-side creation
    "view", "_unsafe_view", "reshape", "transpose", "t", "expand", "slice", "select", "unsqueeze", "squeeze",
    "as_strided", "detach", "alias", "permute", "split", "split_with_sizes", "narrow", "lift_fresh", "empty",
    "empty_strided", "unbind", "_reshape_alias", "is_same_size", "sym_size", "sym_stride", "sym_numel", "dim",
    "lift_fresh_copy", "_local_scalar_dense", "empty_like", "new_empty",
})  # fmt: skip
SYNCING = frozenset({"_local_scalar_dense", "nonzero", "masked_select", "unique", "_unique2", "tolist"})


@dataclass
class Counts:
    """Per phase of the loop: host synchronisations, and ops launched outside graph bodies."""

    syncs: collections.Counter[str] = field(default_factory=collections.Counter)
    eager_ops: collections.Counter[str] = field(default_factory=collections.Counter)
    sync_ops: collections.Counter[str] = field(default_factory=collections.Counter)  # by op name

    @property
    def total_syncs(self) -> int:
        return sum(self.syncs.values())

    @property
    def total_eager_ops(self) -> int:
        return sum(self.eager_ops.values())


class _Counter(TorchDispatchMode):
    def __init__(self, counts: Counts) -> None:
        super().__init__()
        self.counts, self.phase, self.paused = counts, "outside", 0

    def note_sync(self, name: str) -> None:
        if not self.paused:
            self.counts.syncs[self.phase] += 1
            self.counts.sync_ops[name] += 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        name = func.overloadpacket.__name__.rstrip("_")
        if not self.paused:
            syncing = name in SYNCING or (
                name == "index" and any(
                    isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (args[1] if len(args) > 1 else ())
                )
            ) or (name in ("_to_copy", "copy") and _to_host(args, kwargs))  # fmt: skip
            if syncing:
                self.note_sync(name)
            if name not in FREE:
                self.counts.eager_ops[self.phase] += 1
        return func(*args, **(kwargs or {}))


def _to_host(args: tuple[Any, ...], kwargs: dict[str, Any] | None) -> bool:
    """A copy from a non-CPU tensor to the CPU (on a CPU run: never; on CUDA: a sync)."""
    source = args[1] if len(args) > 1 and isinstance(args[1], torch.Tensor) else args[0]
    target_device = (kwargs or {}).get("device")
    return isinstance(source, torch.Tensor) and source.device.type != "cpu" and str(target_device) == "cpu"


@contextlib.contextmanager
def counting() -> Iterator[Counts]:
    """Count inside the block; graph bodies (`StepGraphs._body`, a `Replays` replay: one op) are left out, phases
    taken from `Stats.phase`."""
    counts = Counts()
    counter = _Counter(counts)
    body, phase, tolist = graphs.StepGraphs._body, metrics.Stats.phase, torch.Tensor.tolist
    replay = Replays._replay

    def uncounted(run: Any, *, ops: int = 0) -> Any:
        """`run`, its ops left out; `ops` counted instead (a replay is one launch, whatever its body holds)."""

        def call(*args: Any, **kwargs: Any) -> Any:
            counter.paused += 1
            try:
                return run(*args, **kwargs)
            finally:
                counter.paused -= 1
                counter.counts.eager_ops[counter.phase] += ops

        return call

    @contextlib.contextmanager
    def named(self: metrics.Stats, name: str, device: torch.device | None = None) -> Iterator[None]:
        outer, counter.phase = counter.phase, name
        try:
            with phase(self, name, device):
                yield
        finally:
            counter.phase = outer

    def counted_tolist(self: torch.Tensor) -> Any:
        counter.note_sync("tolist")
        return tolist(self)

    graphs.StepGraphs._body = uncounted(body)  # type: ignore[method-assign]
    Replays._replay = staticmethod(uncounted(replay, ops=1))  # type: ignore[method-assign,assignment]
    metrics.Stats.phase = named  # type: ignore[method-assign,assignment]
    torch.Tensor.tolist = counted_tolist  # type: ignore[method-assign]
    try:
        with counter:
            yield counts
    finally:
        graphs.StepGraphs._body = body  # type: ignore[method-assign]
        Replays._replay = staticmethod(replay)  # type: ignore[method-assign,assignment]
        metrics.Stats.phase = phase  # type: ignore[method-assign]
        torch.Tensor.tolist = tolist  # type: ignore[method-assign]
