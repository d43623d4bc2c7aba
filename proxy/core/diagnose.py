"""Why the server's prompt token count differs from ours: one cause per analysed request.

Two pure steps. `build_profile(tok)` measures, once per tokenizer, the few numbers that drift signatures are
made of (how many special tokens a plain encode adds, whether the template emits BOS itself, how long the
generation prompt is). `classify(result, server_tokens, profile)` then names the cause of
`server − reference` for one request from arithmetic alone: no tokenizer call, no I/O, never raises.

The reference is `result.templated` for chat-like requests (the issue's "server − templated") and
`result.expected_server` otherwise (completions/embeddings, and chat requests the proxy could only count
bare because the template was missing or failed).

Checks run in this order; the first that applies wins (docs/drift.md gives the rationale):

1. `unknown`              no server count, no reference count, or a result the proxy could not count;
2. `exact`                difference 0;
3. `media`                the request carried media parts whose tokens islwatch did not predict (images by
                          URL, video, audio, images of a model without a rule: core/images.py): the server
                          expands them into placeholder tokens, so any difference is expected;
4. `tools_unmodeled`      the request carried tools: servers render tools in their own way (tool parsers,
                          grammar prompts), so any difference is expected; checked before the arithmetic
                          signatures because an unmodeled amount makes them coincidences;
5. `duplicate_bos`        chat only: the template emits BOS itself and the difference equals the number of
                          special tokens a plain encode adds (the server encoded the rendered text with
                          `add_special_tokens=True`, e.g. vLLM's `add_special_tokens` chat extension);
6. `template_not_applied` chat only: the server saw fewer tokens than templated, and its count equals the
                          bare count or the bare count plus the plain special tokens (the server tokenized
                          the texts without the template); with k messages a window of ±2(k−1) tokens
                          allows for the separators a template-less server joins texts with;
7. `generation_prompt_mismatch` chat only: the difference is ± the generation prompt's length (the server
                          did not add the assistant header we expected, or added one we did not);
8. `hidden_system_prompt` chat only: a positive difference of at least `HIDDEN_SYSTEM_MIN_TOKENS` not
                          explained above (the server prepends text: a default or injected system prompt);
9. `unknown`              everything else (negative differences, small positive ones, completions drift).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from proxy.core.causes import (
    DUPLICATE_BOS,
    EXACT,
    GENERATION_PROMPT_MISMATCH,
    HIDDEN_SYSTEM_PROMPT,
    MEDIA,
    TEMPLATE_NOT_APPLIED,
    TOOLS_UNMODELED,
    UNKNOWN,
)
from proxy.core.count import BARE_FALLBACK, CHAT_TEMPLATE, CountResult
from proxy.core.tokens import input_ids, template_of

# The smallest system turn any common template can wrap is a role header plus a word plus an end marker:
# ChatML `<|im_start|>system\nX<|im_end|>\n` is 5 tokens, Llama-3's header block 6. Positive differences
# of 1-2 tokens are far more often tokenizer version drift (a merge, a prefix space) than a system prompt,
# so they stay `unknown` rather than being blamed on a prompt that cannot be that short.
HIDDEN_SYSTEM_MIN_TOKENS = 3

# A conversation every chat template accepts: one user turn (no system role, trivially alternating).
_PROBE = [{"role": "user", "content": "hello"}]
_PROBE_TEXT = "hello"


@dataclass(frozen=True)
class DriftProfile:
    """Tokenizer facts the drift signatures are made of; computed once by `build_profile`."""

    has_template: bool
    plain_special_tokens: int  # len(encode(x, add_special_tokens=True)) − len(encode(x, False))
    plain_adds_bos: bool  # the plain special-token pass starts with the BOS id
    template_emits_bos: bool  # a rendered prompt already starts with the BOS text
    # len(add_generation_prompt=True) − len(False); signed: templates such as Phi-3 close the last turn
    # with a different token when there is no generation prompt. 0 when unknown or equal.
    generation_prompt_tokens: int
    bos_text: str | None
    bos_id: int | None


def _bos(tok: Any) -> tuple[str | None, int | None]:
    text = getattr(tok, "bos_token", None)
    text = text if isinstance(text, str) and text else None
    bos_id = getattr(tok, "bos_token_id", None)
    return text, bos_id if isinstance(bos_id, int) else None


def _plain_specials(tok: Any, bos_id: int | None) -> tuple[int, bool]:
    try:
        with_sp = list(tok(_PROBE_TEXT, add_special_tokens=True)["input_ids"])
        without = list(tok(_PROBE_TEXT, add_special_tokens=False)["input_ids"])
    except Exception:  # a tokenizer that cannot encode a plain word has no signature to measure
        return 0, False
    adds_bos = bos_id is not None and bool(with_sp) and with_sp[0] == bos_id
    return max(len(with_sp) - len(without), 0), adds_bos


def _template_facts(tok: Any, bos_text: str | None) -> tuple[bool, int]:
    """(rendered prompt starts with BOS text, generation prompt token count)."""
    try:
        with_gen = tok.apply_chat_template(_PROBE, tokenize=False, add_generation_prompt=True)
        without_gen = tok.apply_chat_template(_PROBE, tokenize=False, add_generation_prompt=False)
        n_with = len(input_ids(tok(with_gen, add_special_tokens=False)))
        n_without = len(input_ids(tok(without_gen, add_special_tokens=False)))
    except Exception:  # templates may raise on anything; the profile then carries no template signature
        return False, 0
    emits_bos = bos_text is not None and isinstance(with_gen, str) and with_gen.startswith(bos_text)
    return emits_bos, n_with - n_without


def build_profile(tok: Any) -> DriftProfile:
    """Measure the drift signatures of one tokenizer. Never raises; unmeasurable facts default to 'none'."""
    bos_text, bos_id = _bos(tok)
    plain, adds_bos = _plain_specials(tok, bos_id)
    has_template = template_of(tok) is not None
    emits_bos, gen = _template_facts(tok, bos_text) if has_template else (False, 0)
    return DriftProfile(
        has_template=has_template,
        plain_special_tokens=plain,
        plain_adds_bos=adds_bos,
        template_emits_bos=emits_bos,
        generation_prompt_tokens=gen,
        bos_text=bos_text,
        bos_id=bos_id,
    )


def _is_chat(result: CountResult) -> bool:
    # Chat-like: rendered by the template, or a chat request counted bare because the template was
    # missing or failed. Completions/embeddings prompts are plain encodes (method plain_encode/token_ids).
    return result.method in (CHAT_TEMPLATE, BARE_FALLBACK)


def _near_bare(server: int, bare: int, plain: int, messages: int) -> bool:
    """The server count is what the message texts cost without a template.

    One message: exactly bare, or bare plus the plain special tokens. A server without a template joins
    several texts with a separator (vLLM and the emulator use "\\n"): each join adds the separator token
    and re-segments the word after it (SentencePiece: "▁Paris" becomes "Par" "is" after a newline), or
    merges into a neighbour. Each extra message widens the window by two tokens on either side; a
    template's own per-message overhead (role headers, end markers) is larger, so it stays outside.
    """
    slack = 2 * max(messages - 1, 0)
    return bare - slack <= server <= bare + plain + slack


def _classify(result: CountResult, server: int, profile: DriftProfile) -> str:
    reference = result.templated if result.templated is not None else result.expected_server
    if reference is None or isinstance(server, bool) or not isinstance(server, int):
        return UNKNOWN
    diff = server - reference
    if diff == 0:
        return EXACT
    if result.unpredicted_media:
        return MEDIA
    if result.tools:
        return TOOLS_UNMODELED
    if not _is_chat(result):
        return UNKNOWN
    plain = profile.plain_special_tokens
    if result.templated is not None and profile.template_emits_bos and plain > 0 and diff == plain:
        return DUPLICATE_BOS
    # With a template, skipping it loses the structure tokens, so the server saw fewer (diff < 0).
    below = diff < 0 or result.templated is None
    if below and result.bare is not None and _near_bare(server, result.bare, plain, result.messages):
        return TEMPLATE_NOT_APPLIED
    gen = profile.generation_prompt_tokens
    if result.templated is not None and gen != 0 and abs(diff) == abs(gen):
        return GENERATION_PROMPT_MISMATCH
    if result.templated is not None and diff >= HIDDEN_SYSTEM_MIN_TOKENS:
        return HIDDEN_SYSTEM_PROMPT
    return UNKNOWN


def classify(result: CountResult, server_tokens: int, profile: DriftProfile) -> str:
    """The cause of `server_tokens − reference` for one request: one of `causes.CAUSES`. Pure. A server count that
    is not an int is `unknown`; a malformed result or profile is an islwatch bug and raises."""
    return _classify(result, server_tokens, profile)
