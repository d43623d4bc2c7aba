"""The serialization paths: every way the parity gate turns a conversation into ids.

The reference is the direct path, `apply_chat_template(tokenize=True)`, which is what vLLM and SGLang feed
the model for chat requests. A serving adapter usually takes the split path instead: render the template to
text, then encode it. The split path is only equal when the encode adds no special tokens
(`add_special_tokens=False`): the template already wrote BOS, and a second pass writes it again (vLLM
documents this for its `add_special_tokens` chat extension). The other paths are negative controls and the
multi-turn history. Rendering and encoding go through proxy/core/tokens.py, like every other part of
islwatch.

No transformers import: `islwatch parity --help` reads the row names from here.
"""

from __future__ import annotations

from typing import Any

from proxy.core.tokens import Messages, encode, render_messages, template_ids

# Row names, in table order. `split` is what a correct adapter does; `extra-special` and `wrong-role` are
# negative controls (they must differ from direct where the tokenizer adds BOS / has a generation prompt).
DIRECT = "direct"
SPLIT = "split"
EXTRA_SPECIAL = "extra-special"
GEN_OFF = "gen-off"
PREFILL_CONTINUED = "prefill-continued"
PREFILL_CLOSED = "prefill-closed"
WRONG_ROLE = "wrong-role"
MULTI_TURN = "multi-turn"
MULTI_TURN_SERVING = "multi-turn-serving"
# What `--serving-path` may claim the adapter does; the gate compares it with direct.
SERVING_PATHS = (SPLIT, EXTRA_SPECIAL, GEN_OFF, WRONG_ROLE)
NEGATIVE_CONTROLS = (EXTRA_SPECIAL, WRONG_ROLE)

# (row, reference row). Order is the table's.
ROWS: tuple[tuple[str, str | None], ...] = (
    (DIRECT, None),
    (SPLIT, DIRECT),
    (EXTRA_SPECIAL, DIRECT),
    (GEN_OFF, DIRECT),
    (PREFILL_CONTINUED, DIRECT),
    (PREFILL_CLOSED, PREFILL_CONTINUED),
    (WRONG_ROLE, DIRECT),
    (MULTI_TURN, None),
    (MULTI_TURN_SERVING, MULTI_TURN),
)

BUILTIN_CONVERSATIONS: tuple[Messages, ...] = (
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "user", "content": "Hello! What is 2+2?"},
        {"role": "assistant", "content": "2+2 equals 4."},
        {"role": "user", "content": "Thanks. Now say it in French."},
    ],
    # Whitespace and non-ASCII at the edges are where a re-encode merges differently.
    [{"role": "user", "content": "  Leading spaces, café, 東京 🙂\n\nand a blank line.  "}],
    # Templates that reject a system role (Mistral v0.1) skip this one; the others must render it.
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Name a prime number."},
    ],
)
PREFILL = {"role": "assistant", "content": "The answer is"}
# Completed assistant turns, each closed with EOS: the legitimate repetition the gate must accept.
HISTORY = (
    {"role": "assistant", "content": "Four."},
    {"role": "user", "content": "And doubled?"},
    {"role": "assistant", "content": "Eight."},
    {"role": "user", "content": "Thanks."},
)

_ROLE_SWAPS = (("assistant", "user"), ("Assistant", "User"), ("ASSISTANT", "USER"))


def wrong_role_text(tok: Any, messages: Messages) -> str | None:
    """The prompt with the generation prompt opened for the user role instead of the assistant.

    Found by rendering with and without the generation prompt and swapping the last assistant role name
    that lies in the part only the generation prompt wrote. None when the template has no such part
    (Mistral v0.1 adds nothing for a generation prompt).
    """
    with_gen = render_messages(tok, messages, True, False)
    without = render_messages(tok, messages, False, False)
    common = _common_prefix_len(with_gen, without)
    for old, new in _ROLE_SWAPS:
        at = with_gen.rfind(old)
        if at >= common:
            return with_gen[:at] + new + with_gen[at + len(old) :]
    return None


def _common_prefix_len(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def with_prefill(messages: Messages) -> Messages:
    return messages if messages and messages[-1].get("role") == "assistant" else [*messages, PREFILL]


def history(messages: Messages) -> Messages:
    """The conversation continued with completed assistant turns (EOS legitimately repeated)."""
    base = (
        messages if messages[-1].get("role") == "user" else [*messages, {"role": "user", "content": "Go on."}]
    )
    return [*base, *HISTORY]


def split_ids(tok: Any, messages: Messages, gen: bool, cont: bool, add_special_tokens: bool) -> list[int]:
    """Render to text, then encode: what a serving adapter does (correct without special tokens)."""
    return encode(tok, render_messages(tok, messages, gen, cont), add_special_tokens)


def serving_ids(tok: Any, messages: Messages, serving_path: str, gen: bool, cont: bool) -> list[int] | None:
    """What an adapter of kind `serving_path` sends to the model for these messages."""
    if serving_path == SPLIT:
        return split_ids(tok, messages, gen, cont, False)
    if serving_path == EXTRA_SPECIAL:
        return split_ids(tok, messages, gen, cont, True)
    if serving_path == GEN_OFF:
        return template_ids(tok, messages, False, cont)
    text = wrong_role_text(tok, messages) if gen and not cont else None
    return None if text is None else encode(tok, text, False)


def path_ids(
    tok: Any, name: str, messages: Messages, gen: bool, cont: bool, serving_path: str
) -> tuple[list[int] | None, str | None]:
    """The ids of row `name` under the request flags, or None and why the path does not apply."""
    if name == DIRECT:
        return template_ids(tok, messages, gen, cont), None
    if name in (SPLIT, EXTRA_SPECIAL):
        return split_ids(tok, messages, gen, cont, name == EXTRA_SPECIAL), None
    if name == GEN_OFF:
        return template_ids(tok, messages, False, cont), None
    if name == PREFILL_CONTINUED:
        return template_ids(tok, with_prefill(messages), False, True), None
    if name == PREFILL_CLOSED:
        return template_ids(tok, with_prefill(messages), False, False), None
    if name == WRONG_ROLE:
        if not gen or cont:
            return None, "no generation prompt in this mode"
        text = wrong_role_text(tok, messages)
        return (None, "template adds no role header") if text is None else (encode(tok, text, False), None)
    if name == MULTI_TURN:
        return template_ids(tok, history(messages), gen, False), None
    if name == MULTI_TURN_SERVING:
        ids = serving_ids(tok, history(messages), serving_path, gen, False)
        return ids, None if ids is not None else "serving path does not apply"
    raise ValueError(name)
