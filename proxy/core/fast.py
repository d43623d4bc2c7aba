"""The fast encoder: the reference encoder's answers (core/encoders.py) with less tokenizer work.

Where the time goes in `count_request` for a ~1,000-token chat: two full encodes (the bare texts and the
rendered prompt), each through the transformers `__call__` wrapper (BatchEncoding, offsets, attention mask).

What this module changes, each step checked on this tokenizer when the encoder is built; a step that is not
proven falls back to the reference encoder's, so `count(FastEncoder(tok), ...)` equals `count_request(tok, ...)`:

1. Direct encode: a private copy of the Rust backend (no truncation, no padding, the tokenizer's
   `split_special_tokens`) encodes with `encode_batch_fast` (no offsets). Used only if its ids equal
   `tok(text, add_special_tokens=False)` on the sample texts (`direct_proven`).
2. Bare texts: a count per text, cached by a content digest (exact by definition: same text, same count).
3. Segment reuse (`reuse_proven`): the `tokenizers` library extracts added tokens (matched on the raw text)
   before normalising and pre-tokenising, then encodes the pieces between them independently. So the
   rendered prompt's count is the number of added-token matches plus, per piece, the count of that piece
   encoded between the same neighbouring added tokens (`prev + piece + next`, minus the two neighbours: that
   reproduces offset-dependent rules such as Metaspace `prepend_scheme="first"` and lstrip/rstrip). Pieces
   are cached by digest, so a conversation's earlier turns are not encoded again on its next request. Used
   only if the split sum equals the full encode on every sample conversation and string; tokenizers with
   single-word added tokens or with special-token splitting switched on are not eligible.
4. Render shortcut (`render_proven`): plain text chats (roles and string contents only, no tools, documents,
   template kwargs or continued messages) are rendered by the template transformers compiled and cached,
   skipping `apply_chat_template`'s per-call conversions (copies of every message, None-key removal,
   reasoning-field aliases), which are identities for them. Used only if it renders every sample
   conversation exactly as `apply_chat_template` does; `_compile_jinja_template` is transformers' private
   helper (reached through proxy/runtime/compat.py), so a release that moves it only turns the shortcut off.

Privacy: the caches hold 16-byte BLAKE2b digests of text and integer counts, never the text itself, and are
bounded LRUs (`cache_entries` per cache). Thread-safe (one lock per cache).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from tokenizers import Tokenizer

from proxy.runtime import compat

from .count import Encoder
from .encoders import ReferenceEncoder
from .extract import ChatInput
from .images import ImageModel
from .lru import Lru, digest
from .tokens import render_messages

_PLAIN_KEYS = frozenset({"role", "content", "name"})
DEFAULT_CACHE_ENTRIES = 65536  # ~100 bytes each: a few MB per tokenizer

# Sample texts for the load-time checks: whitespace at the edges, runs of spaces and newlines, digits,
# contractions, non-Latin scripts, emoji, and an added token's text inside a message (filled in per tokenizer).
SAMPLE_TEXTS = (
    "What is the capital of France?",
    " leading space",
    "trailing space ",
    "\nleading newline",
    "trailing newline\n",
    "  two  spaces\n\n  and blank lines\n\n",
    "It's 12345 o'clock; they'll've done it.",
    "Unicode: café, naïve, 東京, Ελληνικά, 🙂👍🏽",
    "\t tabs\tand\r\nCRLF\r\n",
    "def main():\n    return 42\n",
    "x",
    " ",
    "",
)


class FastEncoder(ReferenceEncoder):
    """`count(FastEncoder(tok), endpoint, body)` returns what `count_request(tok, endpoint, body)` returns."""

    def __init__(
        self, tok: Any, cache_entries: int = DEFAULT_CACHE_ENTRIES, images: ImageModel | None = None
    ) -> None:
        super().__init__(tok, images)
        self._texts = Lru(cache_entries)
        self._pieces = Lru(cache_entries)
        self._backend = _direct_backend(tok)
        self._split_special = bool(getattr(tok, "split_special_tokens", False))
        self._splitter: re.Pattern[str] | None = None
        self._fallbacks: list[str] = []
        self._compiled, self._special_tokens = self._compile_template()
        self.direct_proven = self._backend is not None and self._check_direct()
        self.reuse_proven = self.direct_proven and self._check_reuse()
        self.render_proven = self._compiled is not None and self._check_render()
        self.fallbacks = tuple(self._fallbacks)

    # ---- the encoder steps ----------------------------------------------------------------------------------

    def texts_len(self, texts: list[str]) -> int:
        if not self.direct_proven:
            return super().texts_len(texts)
        texts = [t for t in texts if t]
        return sum(self._cached_counts(self._texts, [(digest(t), t, 0) for t in texts]))

    def rendered_len(self, text: str) -> int:
        if self.reuse_proven:
            return self._split_count(text, self._pieces)
        if self.direct_proven:
            return self._encode_lens([text])[0]
        return super().rendered_len(text)

    def render(self, chat: ChatInput) -> str:
        if not self.render_proven or not _plain(chat):
            return super().render(chat)
        return self._render_compiled(chat.messages, chat.add_generation_prompt)

    # ---- caches -------------------------------------------------------------------------------------------

    def clear_caches(self) -> None:
        self._texts.clear()
        self._pieces.clear()

    def cache_keys(self) -> list[Any]:
        """Every key the caches hold (digests and neighbouring added tokens: never a client's text)."""
        return [*self._texts.keys(), *self._pieces.keys()]

    def cache_stats(self) -> dict[str, int]:
        return {
            "text_entries": len(self._texts),
            "text_hits": self._texts.hits,
            "text_misses": self._texts.misses,
            "piece_entries": len(self._pieces),
            "piece_hits": self._pieces.hits,
            "piece_misses": self._pieces.misses,
        }

    # ---- internals ----------------------------------------------------------------------------------------

    def _render_compiled(self, messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        assert self._compiled is not None
        return str(
            self._compiled.render(
                messages=messages,
                tools=None,
                documents=None,
                add_generation_prompt=add_generation_prompt,
                **self._special_tokens,
            )
        )

    def _encode_lens(self, texts: Sequence[str]) -> list[int]:
        assert self._backend is not None
        backend = _unconfigured(self._backend, self._split_special)
        return [len(e.ids) for e in backend.encode_batch_fast(list(texts), add_special_tokens=False)]

    def _cached_counts(self, cache: Lru, items: list[tuple[Any, str, int]]) -> list[int]:
        """items: (key, text to encode, tokens to subtract). Misses are encoded in one batch."""
        counts: list[int | None] = [cache.get(key) for key, _, _ in items]
        missing = [i for i, c in enumerate(counts) if c is None]
        if missing:
            lens = self._encode_lens([items[i][1] for i in missing])
            for i, n in zip(missing, lens, strict=True):
                counts[i] = n - items[i][2]
                cache.put(items[i][0], n - items[i][2])
        return [c for c in counts if c is not None]

    def _split_count(self, rendered: str, cache: Lru) -> int:
        assert self._splitter is not None
        parts = self._splitter.split(rendered)  # [piece, token, piece, token, ..., piece]
        pieces, tokens = parts[0::2], parts[1::2]
        items: list[tuple[Any, str, int]] = []
        for i, piece in enumerate(pieces):
            if not piece:
                continue
            prev = tokens[i - 1] if i > 0 else None
            nxt = tokens[i] if i < len(tokens) else None
            # The neighbours are part of the key: they decide stripping and offset-dependent prefixes.
            key = (digest(piece), prev, nxt)
            items.append((key, (prev or "") + piece + (nxt or ""), (prev is not None) + (nxt is not None)))
        return len(tokens) + sum(self._cached_counts(cache, items))

    def _samples(self) -> list[str]:
        """Sample strings: texts, texts around added tokens, and rendered sample conversations."""
        added = sorted({t.content for t in self._backend.get_added_tokens_decoder().values()})  # type: ignore[union-attr]
        some = added[:4] + added[-4:]
        texts = [*SAMPLE_TEXTS, *(f"see {a} here" for a in some), *(f"{a} {a}\n{a}" for a in some)]
        out = list(texts)
        for a in some:
            for t in SAMPLE_TEXTS[:10]:
                out.extend((a + t, t + a, a + t + a))
        for messages in _sample_conversations():
            for gen in (True, False):
                try:
                    out.append(render_messages(self.tok, messages, add_generation_prompt=gen))
                except Exception:
                    continue  # templates that refuse a shape (no system role, strict alternation)
        return [s for s in out if isinstance(s, str)]

    def _check_direct(self) -> bool:
        try:
            samples = self._samples()
            ref = [list(ids) for ids in self.tok(samples, add_special_tokens=False)["input_ids"]]
            backend = _unconfigured(self._backend, self._split_special)  # type: ignore[arg-type]
            fast = [list(e.ids) for e in backend.encode_batch_fast(samples, add_special_tokens=False)]
        except Exception:
            return self._fell_back("direct_raised")
        return ref == fast or self._fell_back("direct_differs")

    def _check_reuse(self) -> bool:
        backend = self._backend
        assert backend is not None
        added = list(backend.get_added_tokens_decoder().values())
        if self._split_special or any(t.single_word for t in added):
            return False
        raw_matched = sorted(
            {t.content for t in added if not t.normalized and t.content}, key=len, reverse=True
        )
        if not raw_matched:
            return False
        # Longest first at each position, like the library's leftmost-longest matcher.
        self._splitter = re.compile("(" + "|".join(re.escape(c) for c in raw_matched) + ")")
        try:
            probe = Lru(0)  # no caching during the check: every piece is really encoded
            samples = self._samples()
            full = self._encode_lens(samples)
            same = all(self._split_count(s, probe) == n for s, n in zip(samples, full, strict=True))
        except Exception:
            return self._fell_back("reuse_raised")
        return same or self._fell_back("reuse_differs")

    def _check_render(self) -> bool:
        """The compiled template renders every sample conversation as apply_chat_template does."""
        try:
            for messages in _sample_conversations():
                for gen in (True, False):
                    try:
                        want = render_messages(self.tok, messages, add_generation_prompt=gen)
                    except Exception:
                        continue  # a shape the template refuses: nothing to compare
                    if self._render_compiled(messages, gen) != want:
                        return self._fell_back("render_differs")
            return True
        except Exception:
            return self._fell_back("render_raised")

    def _fell_back(self, reason: str) -> bool:
        """Note why a shortcut is off (fallbacks.FALLBACK_REASONS); False, the check's answer."""
        self._fallbacks.append(reason)
        return False

    def _compile_template(self) -> tuple[Any, dict[str, Any]]:
        """transformers' own compiled template and the special-token variables it renders with (a snapshot)."""
        tok = self.tok
        if self.template is None or not isinstance(getattr(tok, "chat_template", None), str):
            return None, {}
        try:
            compiled = compat.compile_jinja_template(self.template)
            specials = dict(tok.special_tokens_map) if compiled is not None else {}
        except Exception:  # a template jinja cannot compile: apply_chat_template raises the same
            self._fell_back("render_raised")
            return None, {}
        if compiled is None:  # a private helper: if it moves, every request takes apply_chat_template
            self._fell_back("template_compiler_missing")
        return compiled, specials


def _plain(chat: ChatInput) -> bool:
    """A chat the render shortcut covers: string roles and contents (and names), nothing else (not even an
    empty tool list: a template may test `tools is not none`)."""
    if chat.tools is not None or chat.documents or chat.template_kwargs or chat.continue_final_message:
        return False
    return all(m.keys() <= _PLAIN_KEYS and all(type(v) is str for v in m.values()) for m in chat.messages)


def best_encoder(
    tok: Any, cache_entries: int = DEFAULT_CACHE_ENTRIES, images: ImageModel | None = None
) -> Encoder:
    """The fast encoder where any of its steps is proven for this tokenizer, else the reference encoder."""
    fast = FastEncoder(tok, cache_entries, images)
    if fast.direct_proven or fast.render_proven:
        return fast
    reference = ReferenceEncoder(tok, images)
    reference.fallbacks = fast.fallbacks
    return reference


def _direct_backend(tok: Any) -> Tokenizer | None:
    """The tokenizer's own Rust backend, encoded with directly. Not a copy (`Tokenizer.from_str(to_str())`
    costs 44 MB with Llama-3, per process): transformers reconfigures it on each call
    (`set_truncation_and_padding`, `encode_special_tokens`), so `_unconfigured` sets it back before every
    direct encode."""
    backend = getattr(tok, "backend_tokenizer", None)
    if not isinstance(backend, Tokenizer) or not hasattr(backend, "encode_batch_fast"):
        return None
    return backend


def _unconfigured(backend: Tokenizer, split_special_tokens: bool) -> Tokenizer:
    """`backend` with no truncation or padding and special tokens split as the tokenizer says (~0.1 us)."""
    if backend.truncation is not None:
        backend.no_truncation()
    if backend.padding is not None:
        backend.no_padding()
    if backend.encode_special_tokens != split_special_tokens:
        backend.encode_special_tokens = split_special_tokens
    return backend


def _sample_conversations() -> list[list[dict[str, str]]]:
    t = SAMPLE_TEXTS
    convs: list[list[dict[str, str]]] = [[{"role": "user", "content": x}] for x in t]
    convs.append([{"role": "system", "content": t[0]}, {"role": "user", "content": t[5]}])
    for i in range(0, len(t) - 3, 2):
        convs.append(
            [
                {"role": "user", "content": t[i]},
                {"role": "assistant", "content": t[i + 1]},
                {"role": "user", "content": t[i + 2]},
            ]
        )
    return convs
