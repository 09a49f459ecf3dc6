"""llama.cpp (through `llama-cpp-python`, an optional extra) as one more method of `tokenswift bench`.

It reads the same GGUF file the engine's model was converted from, continues the same prefix token
ids with the closest sampler llama.cpp has (temperature, min-p, a repetition penalty over the last
`penalty_window` tokens; top-k, top-p and typical sampling off) and is timed, like prompt lookup,
from its first new token: its prefill is not counted. Its cache holds f16 keys and values and its
weights stay quantised as in the file, so its text is its own: it is compared for speed only.
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenswift_cli.config import SamplingConfig

METHOD = "llama_cpp"
INSTALL_HINT = "pip install 'tokenswift-cli[llamacpp]' (llama-cpp-python; it compiles for about 15 minutes)"


def available() -> bool:
    """True when `llama-cpp-python` is installed (found without importing it: that loads the library)."""
    return importlib.util.find_spec("llama_cpp") is not None


def gguf_file(model: str) -> Path:
    """The GGUF file behind a bench `--model` ('default' or a .gguf path); ValueError otherwise."""
    if model == "default":
        from tokenswift_cli.model.loading import default_model_path

        return default_model_path()
    path = Path(model).expanduser()
    if path.suffix.lower() == ".gguf" and path.is_file():
        return path
    raise ValueError(f"the llama_cpp method needs a GGUF model (--model default or a .gguf file), not {model}")


@dataclass(frozen=True)
class Timed:
    """New tokens, and the seconds llama.cpp took for all but the first of them."""

    tokens: list[int]
    seconds: float

    @property
    def timed_tokens(self) -> int:
        return max(len(self.tokens) - 1, 0)


class LlamaCpp:
    """One llama.cpp context, sized for the longest case; it reuses the cache of a shared prefix."""

    def __init__(self, gguf: Path, *, context: int, threads: int, sampling: SamplingConfig) -> None:
        if not available():
            raise ValueError(f"the llama_cpp method needs llama-cpp-python: {INSTALL_HINT}")
        import llama_cpp.llama_cpp as api
        from llama_cpp import Llama

        self.sampling = sampling
        # llama.cpp's "extra buffer types" route Q4_1 products to its AMX kernels, which crashed here
        # (a general protection fault in ggml_backend_amx_mul_mat: the OS does not grant AMX tiles);
        # its plain CPU kernels run everywhere. Llama() reads the defaults when it loads the model.
        defaults = api.llama_model_default_params

        def without_extra_buffers() -> Any:
            params = defaults()
            params.use_extra_bufts = False
            return params

        api.llama_model_default_params = without_extra_buffers
        try:
            self.llama: Any = Llama(
                model_path=str(gguf), n_ctx=context, n_threads=threads, n_threads_batch=threads, n_batch=512,
                seed=sampling.seed, last_n_tokens_size=sampling.penalty_window or 64, verbose=False,
            )  # fmt: skip
        finally:
            api.llama_model_default_params = defaults

    def continue_text(self, prompt: Sequence[int], new_tokens: int) -> Timed:
        """Sample `new_tokens` after `prompt` (the end-of-text token does not stop it)."""
        s = self.sampling
        self.llama.set_seed(s.seed)
        stream = self.llama.generate(
            list(prompt), top_k=0, top_p=1.0, typical_p=1.0, min_p=s.min_p or 0.0,
            temp=0.0 if s.greedy else s.temperature, repeat_penalty=s.penalty or 1.0,
        )  # fmt: skip
        tokens: list[int] = []
        first = time.perf_counter()
        for token in stream:
            if not tokens:
                first = time.perf_counter()
            tokens.append(int(token))
            if len(tokens) == new_tokens:
                break
        return Timed(tokens, time.perf_counter() - first)
