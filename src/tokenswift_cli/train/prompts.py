"""Prompts from which the model writes its own training text (self-distillation).

Varied forms (stories, essays, letters, manuals, dialogue, verse) crossed with varied subjects, half
as chat requests and half as plain text to continue, since users do both. The held-out subjects
are never used for training: they give evaluation text that the heads have not seen.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

Tokenizer = Any  # a transformers tokenizer; not imported here so that this module stays light

REQUESTS = (
    "Write a long story about {s}.",
    "Write a detailed essay on {s}.",
    "Write the first chapter of a novel about {s}.",
    "Explain {s} in depth, as a textbook chapter would.",
    "Write a travel diary that describes {s}.",
    "Write a long letter to an old friend about {s}.",
    "Write a play script, with several characters, about {s}.",
    "Write a long poem about {s}.",
    "Write a news report and an interview about {s}.",
    "Write a step-by-step guide related to {s}.",
)
OPENINGS = (
    "Chapter One\n\nIt all began with {s}.",
    "The history of {s} is longer than most people think.",
    "Dear Margaret,\n\nI must tell you about {s}.",
    "Notes on {s}\n\n1.",
    "{S} was the only thing anyone in the village talked about that winter.",
    "In this report we describe {s} and what we learned from it.",
    "ACT I\n\nSCENE I. A room overlooking {s}.\n\n",
    "Once upon a time, long before {s},",
)
SUBJECTS = (
    "a lighthouse on a stormy coast", "the invention of the printing press", "a detective in 1920s Cairo",
    "growing tomatoes in a small garden", "a journey across the Sahara", "the life of honeybees",
    "a robot that learns to paint", "the fall of an ancient empire", "a family bakery", "deep-sea exploration",
    "a chess tournament", "the first winter on Mars", "an orphan who becomes a sailor", "volcanoes",
    "a small-town election", "how bridges are built", "a haunted library", "the migration of whales",
    "a violinist who lost her hearing", "medieval castles", "a friendship between a fox and a crow",
    "learning a new language as an adult", "the railway that crossed the mountains", "a heist at a museum",
    "climate and the polar ice", "a wedding that went wrong", "the origins of mathematics",
    "a king who could not sleep", "a market in old Istanbul", "repairing an old clock",
    "a mountain rescue team", "the science of sleep", "two rival inventors", "a city under the sea",
    "a letter found in an attic", "the discovery of penicillin", "a long-distance runner",
    "a ship lost in the Arctic", "the art of bread making", "a spy during the Cold War",
    "the history of tea", "a teacher in a remote village", "a dragon who hoards books",
    "building a wooden boat", "the stock market crash of 1929", "a circus travelling through Europe",
    "the rainforest at night", "a programmer's first job", "an island with no name",
    "the last day of summer", "a detective story set on a train", "the life of a medieval monk",
)  # fmt: skip
HELD_OUT_SUBJECTS = (
    "a clockmaker's apprentice in Prague", "the salt trade of the Sahara", "a jazz band in 1950s Paris",
    "a glacier that is melting", "an astronaut's letters home", "the history of paper money",
    "a beekeeper and her grandson", "a storm over a fishing harbour",
)  # fmt: skip


@dataclass(frozen=True)
class Prompt:
    """A text to continue; `chat` ones are wrapped in the model's chat template first."""

    text: str
    chat: bool


def _prompts(subjects: tuple[str, ...], count: int, seed: int) -> list[Prompt]:
    rng = random.Random(seed)
    out = []
    for i in range(count):
        subject = subjects[(i // 2) % len(subjects)]
        if i % 2 == 0:
            out.append(Prompt(rng.choice(REQUESTS).format(s=subject), chat=True))
        else:
            opening = rng.choice(OPENINGS)
            out.append(Prompt(opening.format(s=subject, S=subject[0].upper() + subject[1:]), chat=False))
    return out


def encode(tokenizer: Tokenizer, prompt: Prompt) -> list[int]:
    """Token ids of a prompt, through the chat template when it is a request."""
    if prompt.chat and getattr(tokenizer, "chat_template", None):
        message = [{"role": "user", "content": prompt.text}]
        ids = tokenizer.apply_chat_template(message, add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
    return list(tokenizer(prompt.text)["input_ids"])


def training_prompts(count: int, seed: int = 0) -> list[Prompt]:
    """`count` varied prompts over the training subjects."""
    return _prompts(SUBJECTS, count, seed)


def held_out_prompts(count: int, seed: int = 1) -> list[Prompt]:
    """Prompts over subjects never used for training (evaluation only)."""
    return _prompts(HELD_OUT_SUBJECTS, count, seed)
