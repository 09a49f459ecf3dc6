"""Word forms: which tokens spell the same word, for the contextual penalty's word scope.

The penalty over the last W tokens of a path hits every token in the window. In long runs of a
small model that window holds most space-led spellings of the text's words (" Angel"), so the model
escapes through the other spellings of the same words: names run together without spaces
("AngelElijahEvangel..."), all-capitals litanies (docs/quality.md, session 9). With
`--penalty-scope word` a token in the window penalises every token of its *word form*: its text
with the surrounding whitespace stripped, lower-cased (" Angel", "Angel", "angel" and " ANGEL" are
all "angel"). A token whose form is empty (whitespace) or has no letter or digit (punctuation), a
special token, or one that is not whole UTF-8 keeps token scope: it penalises only itself.
It depends only on the path's tokens, so plain and accelerated decoding apply it alike.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported where the tables are built: `tokenswift --help` stays instant
    import torch

    from .config import SamplingConfig


def word_form(piece: bytes) -> str | None:
    """The word `piece` (a token's bytes) spells, stripped and lower-cased; None when it keeps token scope."""
    try:
        form = piece.decode("utf-8").strip().lower()
    except UnicodeDecodeError:  # part of a character: no word of its own
        return None
    return form if any(char.isalnum() for char in form) else None


class WordForms:
    """The word class of every token id: tokens of one word form share a class, the others have one each.

    `classes` `[vocab]` maps a token id to its class; `members` `[vocab, k]` lists, for each token id,
    the ids of its class (itself included), padded with `vocab` (an id that penalises nothing).
    """

    def __init__(self, vocabulary: Sequence[bytes], vocab_size: int, special_ids: Sequence[int] = ()) -> None:
        import torch

        special = set(special_ids)
        groups: dict[str | int, list[int]] = {}  # word form, or the token id itself for token scope
        for token in range(vocab_size):
            form = word_form(vocabulary[token]) if token < len(vocabulary) and token not in special else None
            groups.setdefault(token if form is None else form, []).append(token)
        width = max(map(len, groups.values()), default=1)
        classes, members = [0] * vocab_size, [[vocab_size] * width for _ in range(vocab_size)]
        for index, group in enumerate(groups.values()):
            for token in group:
                classes[token] = index
                members[token][: len(group)] = group
        self.vocab_size = vocab_size
        self.num_classes = len(groups)
        self.classes = torch.tensor(classes, dtype=torch.long)  # [vocab]
        self.members = torch.tensor(members, dtype=torch.long)  # [vocab, k]

    def penalised(self, window: torch.Tensor) -> torch.Tensor:
        """Ids `[n * k]` of the tokens that share a word form with a token of `window` `[n]`,
        padded with `vocab` (HF's repetition penalty drops ids past the vocabulary)."""
        return self.members[window.to(self.members.device)].flatten()


@functools.lru_cache(maxsize=4)
def _word_forms(vocabulary: tuple[bytes, ...], vocab_size: int, special_ids: tuple[int, ...]) -> WordForms:
    return WordForms(vocabulary, vocab_size, special_ids)


def word_forms_of(tokenizer: Any, vocab_size: int) -> WordForms:
    """The word forms of `tokenizer`'s vocabulary, built once per vocabulary (49,152 tokens: ~0.4 s, then ~0.1 s)."""
    from .scripts import token_bytes

    special = tuple(sorted(int(t) for t in getattr(tokenizer, "all_special_ids", ())))
    return _word_forms(tuple(token_bytes(tokenizer)), vocab_size, special)


def bind(sampling: SamplingConfig, tokenizer: Any, vocab_size: int) -> SamplingConfig:
    """`sampling` with the word forms attached when its penalty has word scope."""
    if sampling.penalty_scope != "word":
        return sampling
    return dataclasses.replace(sampling, word_forms=word_forms_of(tokenizer, vocab_size))
