"""How one token id is shown: its text piece, whether it is special, whether it is part of a character.

Pieces are decoded one id at a time with the tokenizer that produced the id, without cleaning spaces, so a
leading space or a newline inside a token is kept. A byte-level token that is only part of a multi-byte
character decodes to U+FFFD; it is shown by its raw vocabulary entry instead and marked `partial`.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Piece:
    text: str              # what the token stands for (raw vocabulary entry when `partial`)
    special: bool = False  # a control token such as <|im_end|>
    partial: bool = False  # a byte piece of a multi-byte character


Labeler = Callable[[int], Piece]


class TokenLabeler:
    """A cached `id -> Piece` for one tokenizer; safe to share between sessions (read-only tokenizer)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.special_ids = frozenset(int(i) for i in (getattr(tokenizer, "all_special_ids", None) or []))
        self._cache: dict[int, Piece] = {}
        self._lock = threading.Lock()

    def __call__(self, token_id: int) -> Piece:
        token_id = int(token_id)
        piece = self._cache.get(token_id)
        if piece is None:
            piece = self._label(token_id)
            with self._lock:
                self._cache[token_id] = piece
        return piece

    def _label(self, token_id: int) -> Piece:
        tok = self.tokenizer
        try:
            text = tok.decode([token_id], skip_special_tokens=False, clean_up_tokenization_spaces=False)
        except Exception:   # an id outside the vocabulary (the naive-id draft can propose one)
            return Piece(f"<id {token_id}>", special=True)
        if token_id in self.special_ids:
            return Piece(text, special=True)
        if "\ufffd" in text:
            raw = tok.convert_ids_to_tokens(token_id)
            return Piece(raw if isinstance(raw, str) else text, partial=True)
        return Piece(text)

    def text(self, token_ids) -> str:
        """The decoded text of a sequence (whole-sequence decode, so split characters join up)."""
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)


def dict_labeler(pieces: dict[int, str], special: set[int] | None = None) -> Labeler:
    """A labeler over a fixed table, for tests and synthetic events."""
    special = special or set()
    return lambda token_id: Piece(pieces.get(int(token_id), f"<{int(token_id)}>"), special=int(token_id) in special)
