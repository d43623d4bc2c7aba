"""The server parity probe: fixed synthetic texts, tokenized by islwatch and by the server, compared id by id.

The same tokenizer folder can load as a different tokenizer class under another transformers release (the
DeepSeek-V3 folder is `LlamaTokenizer` under transformers 5.19, vLLM 0.32's, and `TokenizersBackend` under
5.24: 8 ids against 6 for "Return the word READY."), and llama.cpp's own tokenizer departs from transformers
on some vocabularies. Then every request drifts for one reason the request cannot show. The probe finds it
by asking the server's `/tokenize`: no customer data, only the texts below (whitespace, unicode, digits, code,
the family's special tokens) and one chat rendered from them (probe_set.py builds them with the
tokenizer, in the analysis workers). Pure: ids in, results out; no tokenizer or template engine imported, so
the event-loop process can compare the server's answers.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


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


@dataclass(frozen=True)
class ChatProbe:
    """One chat the server renders itself (probe_set.chat_probe): islwatch's ids for it, and its ids under
    each one-variable change of the template kwargs that renders otherwise."""

    messages: list[dict[str, str]]
    ours: list[int]
    variants: list[tuple[dict[str, Any], list[int]]]


def explain_chat(probe: ChatProbe, theirs: Sequence[int]) -> str | None:
    """When the server's ids for the chat probe differ from islwatch's: the template kwargs under which
    islwatch renders the server's ids, as a content-free phrase; None when no one-variable change does."""
    for kwargs, ids in probe.variants:
        if list(ids) == list(theirs):
            return f"the server renders it as with chat_template_kwargs {json.dumps(kwargs)} (its default?)"
    return None


def chat_summary(probe: ChatProbe, theirs: Sequence[int]) -> str:
    """One content-free line on the chat probe."""
    if list(theirs) == list(probe.ours):
        return "rendered chat equal"
    diff = first_diff(probe.ours, theirs)
    why = explain_chat(probe, theirs)
    line = f"rendered chat differs at {diff} ({len(theirs) - len(probe.ours):+d} tokens)"
    return f"{line}: {why}" if why else line


def first_diff(a: Sequence[int], b: Sequence[int]) -> int | None:
    """First index where the sequences differ; the shorter length when one is a prefix; None if equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


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
