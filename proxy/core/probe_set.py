"""The server parity probe set for one tokenizer (probe.py says what a probe is and compares answers).

Built where the tokenizer is loaded (the analysis workers, `islwatch parity --server`): the fixed texts, the
tokenizer's special tokens between words, one chat rendered with its template, and islwatch's ids for each.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .probe import Probe
from .tokens import encode, render_messages

# Synthetic probe texts (never request content), each a place where tokenizers are known to part ways.
PROBE_TEXTS: tuple[tuple[str, str], ...] = (
    ("sentence", "Return the word READY."),
    ("leading_space", " leading space and  two  spaces"),
    ("newlines", "line one\n\nline three\n"),
    ("tabs_crlf", "\ttab\r\nCRLF\r\n"),
    ("digits", "12345 3.14159 2026-12-01 0x1F"),
    ("contractions", "It's they'll've we'd"),
    ("unicode_nfc", "café naïve Ωμέγα 東京"),
    ("unicode_nfd", "Ame\u0301lie cafe\u0301"),
    ("emoji", "🙂👍🏽 👩‍👩‍👧"),
    ("code", "def main():\n    return {'a': [1, 2]}\n"),
)


def probes(tok: Any) -> list[Probe]:
    """The probe set for one tokenizer: the fixed texts, each special token between words, one chat."""
    out = [Probe(name, text) for name, text in PROBE_TEXTS]
    specials = sorted({t for t in getattr(tok, "all_special_tokens", []) if isinstance(t, str) and t})
    out += [Probe(f"special_{i}", f"before {t} after") for i, t in enumerate(specials[:8])]
    try:
        chat = [{"role": "user", "content": PROBE_TEXTS[0][1]}]
        out.append(Probe("rendered_chat", render_messages(tok, chat, add_generation_prompt=True)))
    except Exception:  # no template, or one that refuses the shape: the plain texts still probe
        pass
    return out


def our_ids(tok: Any, probe_set: Sequence[Probe]) -> list[list[int]]:
    """islwatch's ids: the text alone, no special tokens added (as the server is asked to)."""
    return [encode(tok, p.text, add_special_tokens=False) for p in probe_set]
