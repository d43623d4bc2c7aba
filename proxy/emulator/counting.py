"""`usage.prompt_tokens` as vLLM reports it, computed on the emulator's own tokenizer.

A second implementation, deliberately independent of `proxy/core/count.py`, so the proxy's counting core is
checked against it; the two share only body extraction (`proxy.core.extract`) and the render / encode
primitives (`proxy.core.tokens`), which are the tokenizer calls themselves:

- chat / responses: vLLM prepares the messages (`chat_utils.py`), renders the template with
  `tokenize=False`, then encodes the text with `add_special_tokens` from the request (default False;
  `serving_engine.py` `_preprocess_chat`);
- completions / embeddings: a plain encode with special tokens (default True); token-id prompts as given;
- the Anthropic Messages API: vLLM's conversion into a chat request (shared with the core: it is request
  extraction, like `proxy.core.extract`), then the chat path.

Pure functions of (tokenizer, body, faults); a body vLLM would refuse raises `RequestError`. `tok` renders
(its chat template and template facts); `enc`, when given (the `tokenizer=SPEC` fault), encodes instead of
`tok`, as a server whose tokenizer files changed while its template did not. `/tokenize` (`tokenize_ids`)
follows the same path without the count-changing faults, as vLLM's tokenize endpoint does.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from proxy.core.endpoints import Endpoint
from proxy.core.extract import ChatInput, chat_input, prompt_input, responses_input
from proxy.core.flavors.vllm_messages import messages_as_chat, template_refuses_inline_system
from proxy.core.messages import InvalidBody
from proxy.core.tokens import developer_role, encode, encode_len, parts_format, render_chat, template_of
from proxy.emulator.errors import RequestError
from proxy.emulator.faults import Faults

NO_TEMPLATE_JOIN = "\n"  # `no-template` joins message texts like vLLM joins text parts
WORD_CANDIDATES = ("the", "yes", "ok", "hello", "a", "go", "is", "and")
# transformers' refusal of a tokenizer without a template, which vLLM passes on as a 400.
NO_DEFAULT_TEMPLATE = (
    "As of transformers v4.44, default chat template is no longer allowed, so you must provide a "
    "chat template if the tokenizer does not define one."
)
# `render_chat`'s TypeError when a template renders to something else; answered with this text alone.
NOT_TEXT = "chat template did not render to text"


def _chat_of(tok: Any, endpoint: Endpoint, body: Any) -> ChatInput:
    try:
        facts = (parts_format(tok), developer_role(tok))
        if endpoint == Endpoint.RESPONSES:
            return responses_input(body, *facts)
        chat = chat_input(body, *facts)
    except InvalidBody as exc:
        raise RequestError(str(exc)) from None
    if endpoint == Endpoint.EMBEDDINGS:
        # vLLM's EmbeddingChatRequest defaults add_generation_prompt to False (chat completions: True).
        chat = dataclasses.replace(chat, add_generation_prompt=bool(body.get("add_generation_prompt", False)))
    return chat


def _render(tok: Any, chat: ChatInput, faults: Faults) -> str:
    try:
        return render_chat(tok, chat, add_generation_prompt=False if faults.gen_prompt_off else None)
    except Exception as exc:  # jinja2 errors, raise_exception(), bad kwargs: vLLM answers 400 with the text
        if isinstance(exc, TypeError) and str(exc) == NOT_TEXT:
            raise RequestError(NOT_TEXT) from None
        raise RequestError(f"chat template error: {exc}") from None


def _checked_chat(tok: Any, endpoint: Endpoint, body: Any) -> ChatInput:
    chat = _chat_of(tok, endpoint, body)
    if chat.continue_final_message and chat.add_generation_prompt:
        # vLLM's request validators (check_generation_prompt, chat and tokenize requests) refuse this pair.
        raise RequestError("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
    return chat


def _templated(tok: Any, chat: ChatInput, faults: Faults) -> str:
    if template_of(tok) is None:
        raise RequestError(NO_DEFAULT_TEMPLATE)
    return _render(tok, chat, faults)


def chat_prompt_tokens(tok: Any, endpoint: Endpoint, body: Any, faults: Faults, enc: Any = None) -> int:
    """prompt_tokens of a chat-shaped request (chat, responses, chat-style embeddings) as vLLM reports it."""
    enc = tok if enc is None else enc
    chat = _checked_chat(tok, endpoint, body)
    if faults.no_template:
        # A server without a template: the texts, joined, encoded plainly (BOS included).
        count = encode_len(enc, NO_TEMPLATE_JOIN.join(chat.texts), add_special_tokens=True)
        return count + faults.system_prompt_tokens
    rendered = _templated(tok, chat, faults)
    add_special = chat.add_special_tokens or faults.double_bos
    return encode_len(enc, rendered, add_special_tokens=add_special) + faults.system_prompt_tokens


def chat_prompt_ids(tok: Any, body: Any, faults: Faults, enc: Any = None) -> list[int]:
    """The ids `chat_prompt_tokens` counts for a chat body (the prefix cache hashes them); the hidden
    system prompt of the `system-prompt=N` fault is N ids of -1 in front, the same on every request."""
    enc = tok if enc is None else enc
    chat = _checked_chat(tok, Endpoint.CHAT, body)
    hidden = [-1] * faults.system_prompt_tokens
    if faults.no_template:
        return hidden + encode(enc, NO_TEMPLATE_JOIN.join(chat.texts), True)
    rendered = _templated(tok, chat, faults)
    return hidden + encode(enc, rendered, chat.add_special_tokens or faults.double_bos)


def anthropic_as_chat(tok: Any, endpoint: Endpoint, body: Any) -> dict[str, Any]:
    """The chat request vLLM serves for a Messages request (its conversion, core/flavors/vllm_messages.py:
    the emulator answers like vLLM). The start-up probe of `thinking: disabled` is not run: `none`."""
    merge = template_refuses_inline_system(template_of(tok))
    try:
        return messages_as_chat(body, endpoint == Endpoint.COUNT_TOKENS, merge)
    except InvalidBody as exc:
        raise RequestError(str(exc)) from None


def chat_ids(tok: Any, body: Any, enc: Any = None) -> list[int]:
    """`POST /tokenize` with `messages` (vLLM's TokenizeChatRequest: add_generation_prompt default true,
    continue_final_message and add_special_tokens default false): the rendered chat's ids. The
    count-changing faults are not applied: they model the inference path, not the tokenizer."""
    chat = _checked_chat(tok, Endpoint.CHAT, body)
    return encode(tok if enc is None else enc, _templated(tok, chat, Faults()), chat.add_special_tokens)


def prompt_token_counts(tok: Any, body: Any, field_name: str) -> tuple[int, ...]:
    """Per-prompt counts of completions (`prompt`) / embeddings (`input`): plain encode or ids as given."""
    try:
        inp = prompt_input(body, field_name)
    except InvalidBody as exc:
        raise RequestError(str(exc), param=field_name) from None
    return tuple(
        encode_len(tok, p, inp.add_special_tokens) if isinstance(p, str) else len(p) for p in inp.prompts
    )


def pick_word(tok: Any) -> str:
    """A word that is one token each time it repeats, so `n` repeats are exactly `n` output tokens."""
    for word in WORD_CANDIDATES:
        if all(encode_len(tok, " ".join([word] * n), False) == n for n in (1, 2, 3, 17)):
            return word
    raise ValueError("no single-token word found for the emulator's answer text")
