"""The server parity probe set for one tokenizer (probe.py says what a probe is and compares answers).

Built where the tokenizer is loaded (the analysis workers, `islwatch parity --server`): the fixed texts, the
tokenizer's special tokens between words, one chat rendered with its template, and islwatch's ids for each.
Besides, the chat probe (`chat_probe`): one chat the server renders itself (vLLM's `/tokenize` takes
messages), with islwatch's ids for it under the server-wide template kwargs islwatch was told, and under
each other value of a variable the template reads, so that a server started with other defaults
(`--default-chat-template-kwargs`) is named, not just found to differ.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .probe import ChatProbe, Probe
from .tokens import encode, render_messages, template_of, template_variables

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


# The messages of the chat probe: synthetic, as every probe.
CHAT_MESSAGES: tuple[dict[str, str], ...] = (
    {"role": "system", "content": "You are a parity probe."},
    {"role": "user", "content": PROBE_TEXTS[0][1]},
)
# What transformers' apply_chat_template passes itself (`render_jinja_template`): never a server default.
_PASSED = frozenset(
    {"messages", "tools", "documents", "add_generation_prompt", "continue_final_message", "raise_exception",
     "strftime_now", "bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token",
     "mask_token", "additional_special_tokens", "chat_template", "tokenize", "return_dict"}
)  # fmt: skip
_EFFORTS = ("low", "medium", "high")
MAX_VARIANTS = 16


def _candidates(name: str) -> tuple[Any, ...]:
    """The values a server-wide default of this variable is likely to take: a flag, or an effort level."""
    return _EFFORTS if "effort" in name else (True, False)


def chat_probe(tok: Any, defaults: Mapping[str, Any]) -> ChatProbe | None:
    """The chat probe for a tokenizer with a template: islwatch's ids under `defaults` (the server-wide
    kwargs islwatch was told), and the ids under each one-variable change of them that renders otherwise.
    None without a template, or for one that refuses the probe."""
    template = template_of(tok)
    if not template:
        return None
    messages = [dict(m) for m in CHAT_MESSAGES]

    def ids(kwargs: Mapping[str, Any]) -> list[int]:
        return encode(tok, render_messages(tok, messages, **kwargs), add_special_tokens=False)

    try:
        ours = ids(defaults)
    except Exception:  # a template that refuses the probe: the text probes still run
        return None
    variants: list[tuple[dict[str, Any], list[int]]] = []
    seen = [ours]
    for name in sorted(template_variables(template) - _PASSED):
        for value in _candidates(name):
            kwargs = {**defaults, name: value}
            if kwargs == dict(defaults) or len(variants) >= MAX_VARIANTS:
                continue
            try:
                theirs = ids(kwargs)
            except Exception:  # a value the template refuses is not the server's default
                continue
            if theirs not in seen:
                seen.append(theirs)
                variants.append(({name: value}, theirs))
    return ChatProbe(messages, ours, variants)
