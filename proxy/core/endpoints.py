"""The one table of the OpenAI-compatible endpoints islwatch understands: path, output cap, streaming, usage.

Every other module (the handler, the counting core, the emulator, the loadgen) reads this table instead of
keeping its own copy. Shapes follow the OpenAI API reference (chat, completions, embeddings, responses)
as vLLM serves them (`vllm/entrypoints/openai/protocol.py`), and the Anthropic Messages API
(https://docs.anthropic.com/en/api/messages, `count_tokens` beside it) that vLLM, SGLang and llama-server
serve too (`vllm/entrypoints/anthropic/api_router.py`): a Messages request is converted into a chat request
by each server's own rules (core/flavors/*_messages.py), then counted as a chat.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Endpoint(StrEnum):
    CHAT = "chat"
    COMPLETIONS = "completions"
    EMBEDDINGS = "embeddings"
    RESPONSES = "responses"
    MESSAGES = "messages"  # Anthropic's /v1/messages
    COUNT_TOKENS = "count_tokens"  # Anthropic's /v1/messages/count_tokens: the prompt's count, no generation


@dataclass(frozen=True)
class Shape:
    endpoint: Endpoint
    path: str
    # Request fields that cap the output length, the first one present wins (chat: the newer name first).
    max_tokens_fields: tuple[str, ...]
    streams: bool  # answers with server-sent events when the request says `stream: true`
    include_usage: bool  # takes `stream_options.include_usage` (chat and completions only)
    id_prefix: str  # the prefix of response ids (`chatcmpl-...`, `resp_...`)
    # Where the prompt count sits in `usage`: `prompt_tokens`, or `input_tokens` on /v1/responses and the
    # Messages API (there without the prefix-cache hits: core/usage.py adds them back).
    prompt_usage_field: str = "prompt_tokens"


SHAPES: dict[Endpoint, Shape] = {
    Endpoint.CHAT: Shape(
        Endpoint.CHAT,
        "/v1/chat/completions",
        ("max_completion_tokens", "max_tokens"),
        True,
        True,
        "chatcmpl-",
    ),
    Endpoint.COMPLETIONS: Shape(
        Endpoint.COMPLETIONS, "/v1/completions", ("max_tokens",), True, True, "cmpl-"
    ),
    Endpoint.EMBEDDINGS: Shape(Endpoint.EMBEDDINGS, "/v1/embeddings", (), False, False, "embd-"),
    Endpoint.RESPONSES: Shape(
        Endpoint.RESPONSES, "/v1/responses", ("max_output_tokens",), True, False, "resp_", "input_tokens"
    ),
    Endpoint.MESSAGES: Shape(
        Endpoint.MESSAGES, "/v1/messages", ("max_tokens",), True, False, "msg_", "input_tokens"
    ),
    Endpoint.COUNT_TOKENS: Shape(
        Endpoint.COUNT_TOKENS, "/v1/messages/count_tokens", (), False, False, "", "input_tokens"
    ),
}
# The endpoints whose body is an Anthropic Messages request.
ANTHROPIC = frozenset({Endpoint.MESSAGES, Endpoint.COUNT_TOKENS})
BY_PATH: dict[str, Endpoint] = {shape.path: endpoint for endpoint, shape in SHAPES.items()}


def endpoint_of(method: str, path: str) -> Endpoint | None:
    """The endpoint a request is for, or None for anything islwatch only relays (other paths, non-POST)."""
    return BY_PATH.get(path) if method == "POST" else None
