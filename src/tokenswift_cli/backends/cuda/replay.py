"""CUDA graphs of the engine's small fixed-shape computations: the acceptance walk, the drafts' ranking.

Each is a few dozen kernels of microseconds, so on a GPU their launches, not their work, cost: a graph
replays them in one launch. A computation is a `body` over an `Inputs` of device tensors; its graph is
captured the first time a key (the shapes and settings it depends on) is met, on a copy of the
inputs that later calls overwrite. All graphs of one model share a memory pool: they run one after
another, and each caller reads its outputs before the next replay. `TOKENSWIFT_CUDA_GRAPHS` as for the
forwards: "0" none, "body" the same static-shape body uncaptured on any device (how the CPU tests and
the host-sync count see it).
"""

from __future__ import annotations

import os
import warnings
import weakref
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import torch

from tokenswift_cli.backends.cuda.graphs import GRAPHS

Outputs = tuple[torch.Tensor, ...]


class Inputs(Protocol):
    def tensors(self) -> list[torch.Tensor]: ...

    def clone(self) -> Any: ...


I = TypeVar("I", bound=Inputs)  # noqa: E741


class Replays:
    """One model's graphs of small computations, by key."""

    _of: weakref.WeakKeyDictionary[Any, Replays] = weakref.WeakKeyDictionary()

    def __init__(self, device: torch.device) -> None:
        mode = os.environ.get(GRAPHS, "1")
        self.capture = device.type == "cuda" and mode not in ("0", "body")
        self.enabled = self.capture or mode == "body"
        self.captured: dict[Any, tuple[torch.cuda.CUDAGraph | None, Any, Outputs | None]] = {}
        self.pool = torch.cuda.graph_pool_handle() if self.capture else None
        self.stream = torch.cuda.Stream(device) if self.capture else None

    @classmethod
    def of(cls, owner: Any, device: torch.device) -> Replays:
        """The graphs of `owner` (a model's `Target`), kept while it lives."""
        if owner not in cls._of:
            cls._of[owner] = cls(device)
        return cls._of[owner]

    def run(self, key: Any, inputs: I, body: Callable[[I], Outputs]) -> Outputs:
        """`body(inputs)`, replayed from the graph of `key`: the outputs are overwritten by its next replay."""
        if key not in self.captured:
            self.captured[key] = self._capture(inputs, body)
        graph, static, outputs = self.captured[key]
        for held, new in zip(static.tensors(), inputs.tensors(), strict=True):
            held.copy_(new)
        return self._replay(graph, static, body, outputs)

    def _capture(self, inputs: I, body: Callable[[I], Outputs]) -> tuple[torch.cuda.CUDAGraph | None, I, Any]:
        static = inputs.clone()
        if not self.capture:
            return None, static, None
        stream, current = self.stream, torch.cuda.current_stream()
        assert stream is not None
        stream.wait_stream(current)
        with torch.cuda.stream(stream):
            body(static)  # warm-up: workspaces, kernel choice
        stream.synchronize()
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, pool=self.pool, stream=stream, capture_error_mode="thread_local"):
                outputs = body(static)
        except RuntimeError as error:  # an op that cannot be captured: the same ops, launched one by one
            reason = str(error).splitlines()[0]
            warnings.warn(f"a CUDA graph was not captured ({reason}); running op by op", stacklevel=2)
            torch.cuda.synchronize()
            return None, static, None
        finally:
            current.wait_stream(stream)
        return graph, static, outputs

    @staticmethod
    def _replay(graph: torch.cuda.CUDAGraph | None, static: Any, body: Callable[[Any], Outputs], outputs: Any) -> Any:
        """One launch; uncaptured ("body"), the same ops on the same buffers."""
        if graph is None:
            return body(static)
        graph.replay()
        return outputs
