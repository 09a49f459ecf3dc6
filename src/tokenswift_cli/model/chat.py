"""Requests to an instruct model: the user's words through the model's own chat template.

`--prefix` continues a text; `--prompt` asks for one. An instruct model handed a request as a bare
prefix continues the sentence (and drifts into a Q&A); through its chat template, as the assistant's
turn, it writes what was asked. The templated text is the run's prefix, so resume, checkpoints and
the equality of plain and accelerated decoding work on it unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tokenswift_cli.config import ConfigError


@dataclass(frozen=True)
class ChatRequest:
    """What the user asks (`--prompt`), with an optional system message (`--system`)."""

    prompt: str
    system: str | None = None

    def __post_init__(self) -> None:
        if not self.prompt.strip():
            raise ConfigError("the prompt is empty")

    def render(self, tokenizer: Any) -> str:
        """The request as the model's chat template lays it out, ending where the assistant's answer starts."""
        if not getattr(tokenizer, "chat_template", None):
            raise ConfigError("this model has no chat template: use --prefix to continue a text instead")
        messages = [{"role": "system", "content": self.system}] if self.system else []
        messages.append({"role": "user", "content": self.prompt})
        return str(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False))

    def to_dict(self) -> dict[str, str | None]:
        return {"prompt": self.prompt, "system": self.system}


def prompt_tokens(tokenizer: Any, text: str, *, templated: bool) -> list[int]:
    """Token ids of a run's prefix. A templated text already holds the model's special tokens (a BOS
    among them), so the tokenizer must not add its own."""
    return list(tokenizer(text, add_special_tokens=not templated)["input_ids"])
