"""The reference encoder: every counting step is the tokenizer's own call (see `count.Encoder`).

It is the definition the fast encoder (core/fast.py) is proven against, and what counting falls back to
wherever a shortcut is not proven for a tokenizer.
"""

from __future__ import annotations

from typing import Any

from .extract import ChatInput
from .images import ImageModel
from .tokens import bos_text, developer_role, encode_len, parts_format, render_chat, template_of, texts_len


class ReferenceEncoder:
    # Why fast.py's shortcuts are off for this tokenizer (fallbacks.FALLBACK_REASONS); counted at the server edge.
    fallbacks: tuple[str, ...] = ()

    def __init__(self, tok: Any, images: ImageModel | None = None) -> None:
        self.tok = tok
        self.images = images  # core/vision.py load_image_model; None: images stay unmodelled
        self.template = template_of(tok)
        self.parts_format = parts_format(tok)
        self.developer_role = developer_role(tok)
        self.bos_text = bos_text(tok)

    def texts_len(self, texts: list[str]) -> int:
        return texts_len(self.tok, texts)

    def render(self, chat: ChatInput) -> str:
        return render_chat(self.tok, chat)

    def rendered_len(self, text: str) -> int:
        return encode_len(self.tok, text, add_special_tokens=False)

    def encode_len(self, text: str, add_special_tokens: bool) -> int:
        return encode_len(self.tok, text, add_special_tokens)
