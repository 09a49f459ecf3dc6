"""A tiny model folder (random llama + a word-level tokenizer, saved as `save_pretrained` does) and
helpers to run the real `tokenswift` entry point on it, in a subprocess or through Typer's runner."""

from __future__ import annotations

import fcntl
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedTokenizerFast
from typer.testing import CliRunner

from tokenswift_cli.cli.app import app

_SYLLABLES = ["ka", "lo", "mi", "ren", "tha", "vos", "quel", "dri", "sun", "bar", "ne", "pho", "gru", "ish"]
_rng = random.Random(0)
# Long words: a few hundred tokens fill a pipe, which the interruption tests rely on.
WORDS = sorted({"".join(_rng.choice(_SYLLABLES) for _ in range(_rng.randint(3, 6))) for _ in range(400)})[:240]
WORDS += ["café", "naïve", "日本語", "🙂", "—"]
PREFIX = " ".join(WORDS[:40]) + "\n"


def build_tiny_folder(folder: Path, seed: int = 0) -> Path:
    """A random 2-layer llama with a word-level tokenizer of long words, in `folder`."""
    vocab = {"<unk>": 0, "<eos>": 1, **{word: i + 2 for i, word in enumerate(WORDS)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>", eos_token="<eos>")
    folder.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(folder)
    config = LlamaConfig(
        vocab_size=len(vocab), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192,
        tie_word_embeddings=False, bos_token_id=None, eos_token_id=1, pad_token_id=None,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():  # sharpen the random model so that greedy has no near-ties
        model.get_output_embeddings().weight.normal_(0.0, 0.35)
    model.save_pretrained(folder)
    return folder


CONTENT_TEMPLATE = "{% for m in messages %}{{ m['content'] }} {% endfor %}"  # the messages' words, roles left out


def with_chat_template(folder: Path, template: str = CONTENT_TEMPLATE) -> Path:
    """`folder`'s tokenizer given a chat template, so that the model answers --prompt too."""
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = template
    config_path.write_text(json.dumps(config))
    return folder


@contextmanager
def one_thread() -> Iterator[None]:
    """The tiny model is fastest on one thread, and the machine is shared."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def save_tiny_heads(model_folder: Path, path: Path) -> Path:
    """Random draft heads tagged with the tiny model's fingerprint."""
    from tokenswift_cli.model.heads import DraftHeads, save_heads
    from tokenswift_cli.model.loading import folder_fingerprint

    torch.manual_seed(0)
    heads = DraftHeads(64, 3)
    for block in heads.medusa_layers:
        torch.nn.init.normal_(block.linear.weight, std=0.1)  # type: ignore[union-attr]
    save_heads(heads, path, {"base_model_fingerprint": folder_fingerprint(model_folder)})
    return path


def cli(*args: object, input: str | None = None):  # type: ignore[no-untyped-def]
    """Run the CLI in-process; stdout and stderr are separate in the result."""
    return CliRunner().invoke(app, [str(a) for a in args], input=input)


def run_dir(name: str = "run-001") -> Path:
    return Path(os.environ["TOKENSWIFT_HOME"]) / "runs" / name


def subprocess_env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def command(*args: object) -> list[str]:
    return [sys.executable, "-m", "tokenswift_cli", *(str(a) for a in args)]


def start_blocked_writer(*args: object) -> tuple[subprocess.Popen[bytes], int]:
    """Start `tokenswift` with stdout on a 4 KiB pipe that nobody reads yet.

    The writer blocks once the pipe is full, so it cannot finish before the test signals it.
    Returns the process and the pipe's read end.
    """
    read, write = os.pipe()
    fcntl.fcntl(write, fcntl.F_SETPIPE_SZ, 4096)
    process = subprocess.Popen(command(*args), stdout=write, stderr=subprocess.PIPE, env=subprocess_env())
    os.close(write)
    return process, read


def wait_for(path: Path, process: subprocess.Popen[bytes], timeout: float = 900.0) -> None:
    """Wait until `path` exists (a state of the run, whatever the machine's load); the timeout only ends a hang."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            ended = process.poll() is not None
            if not ended:
                process.kill()
            stderr = process.stderr.read().decode(errors="replace")[-2000:] if process.stderr else ""
            folder = sorted(p.name for p in path.parent.iterdir()) if path.parent.is_dir() else "no folder"
            what = f"the process ended ({process.returncode})" if ended else f"{timeout:.0f} s passed"
            raise AssertionError(f"{what} before {path.name} appeared; {path.parent}: {folder}; stderr: {stderr}")
        time.sleep(0.02)


def drain(read: int) -> bytes:
    chunks = []
    while chunk := os.read(read, 1 << 16):
        chunks.append(chunk)
    os.close(read)
    return b"".join(chunks)
