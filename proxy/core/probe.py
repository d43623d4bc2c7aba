"""The server parity probe: fixed synthetic texts, tokenized by islwatch and by the server, compared id by id.

The same tokenizer folder can load as a different tokenizer class under another transformers release (the
DeepSeek-V3 folder is `LlamaTokenizer` under transformers 5.19, vLLM 0.32's, and `TokenizersBackend` under
5.24: 8 ids against 6 for "Return the word READY."), and llama.cpp's own tokenizer departs from transformers
on some vocabularies. Then every request drifts for one reason the request cannot show. The probe finds it
by asking the server's `/tokenize`: no customer data, only the texts below (whitespace, unicode, digits, code,
the family's special tokens) and one chat rendered from them. Pure: ids in, results out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

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


@dataclass(frozen=True)
class Probe:
    name: str
    text: str


@dataclass(frozen=True)
class ProbeResult:
    name: str
    equal: bool
    first_diff: int | None  # first differing position (the shorter length for a strict prefix)
    ours: int  # token counts, for the log line
    theirs: int


def first_diff(a: Sequence[int], b: Sequence[int]) -> int | None:
    """First index where the sequences differ; the shorter length when one is a prefix; None if equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


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


def compare(
    probe_set: Sequence[Probe], ours: Sequence[Sequence[int]], theirs: Sequence[Sequence[int]]
) -> list[ProbeResult]:
    return [
        ProbeResult(p.name, list(a) == list(b), first_diff(a, b), len(a), len(b))
        for p, a, b in zip(probe_set, ours, theirs, strict=True)
    ]


def summary(results: Sequence[ProbeResult]) -> str:
    """One content-free line: how many probes agree, and each that does not (name, position, count diff)."""
    bad = [r for r in results if not r.equal]
    if not bad:
        return f"server parity ok: {len(results)} probes equal"
    detail = ", ".join(f"{r.name} at {r.first_diff} ({r.theirs - r.ours:+d} tokens)" for r in bad)
    return f"server parity FAILED on {len(bad)} of {len(results)} probes: {detail}"
