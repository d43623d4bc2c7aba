"""islwatch's `sglang` flavor on the Anthropic Messages API against SGLang 0.5.23's own Anthropic path (the
oracle's `messages_answer`: its request models, `AnthropicServing._convert_to_chat_completion_request`, then
its chat preprocessing as `handle_messages` and `handle_count_tokens` chain it), every shape of
tests/anthropic_shapes.py and of SGLANG_SHAPES below on both endpoints and each family: the served model's
count equals the length of SGLang's ids where SGLang accepts the request, and islwatch says SGLang refuses it
where SGLang does. The divergences kept on purpose (`COUNTED_NOT_REFUSED`, `REFUSED_NOT_COUNTED`) are
asserted as such. The reasoning parser islwatch takes the server to run (core/flavors/sglang_messages.py
`documented_parser`) is the one each oracle is started with (sglang_proc.FAMILIES, as SGLang's docs give it).
"""

from __future__ import annotations

from functools import cache
from typing import Any

import pytest

from proxy.core.count import SERVER_REFUSES
from proxy.core.flavors.sglang_messages import documented_parser
from proxy.core.model import ServedModel, load_served_model
from tests.anthropic_shapes import (
    ASK,
    BILLING,
    CALL,
    PNG_1PX,
    SHAPES,
    SYSTEM_TEXT,
    TOOLS,
    WEATHER,
    MessagesShape,
    assistant,
    text,
    thinking,
    tool_result,
    user,
)
from tests.sglang_server.sglang_proc import ANSWER_DEADLINE_SECONDS, FAMILIES, Oracle

pytestmark = pytest.mark.sglang

ENDPOINTS = ("messages", "count_tokens")
IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG_1PX}}
SEARCH_RESULT = {
    "type": "search_result",
    "source": "https://example.org/paris",
    "title": "Paris weather",
    "content": [text("Sunny, 18 C."), text("Light wind.")],
}
WEB_SEARCH = {"type": "web_search_20250305", "name": "web_search"}
# What SGLang's conversion does beyond the shared shapes: its request-model refusals, output_config, thinking
# variants, inline system messages (merged or kept by the template probe), tool_result contents (images, tool
# references, search results), tools' strict / defer_loading, server tools, tool_choice corner cases.
SGLANG_SHAPES: list[MessagesShape] = [
    MessagesShape("effort_high", {"output_config": {"effort": "high"}, "messages": [user("Hello")]}),
    MessagesShape(
        "effort_xhigh_thinking_enabled",
        {
            "thinking": {"type": "enabled", "budget_tokens": 4096},
            "output_config": {"effort": "xhigh"},
            "messages": [user("Hello")],
        },
    ),
    MessagesShape("effort_unknown", {"output_config": {"effort": "none"}, "messages": [user("Hello")]}),
    MessagesShape("thinking_adaptive", {"thinking": {"type": "adaptive"}, "messages": [user("Hello")]}),
    MessagesShape(
        "thinking_adaptive_with_budget",
        {"thinking": {"type": "adaptive", "budget_tokens": 2048}, "messages": [user("Hello")]},
    ),
    MessagesShape(
        "thinking_disabled_with_display",
        {"thinking": {"type": "disabled", "display": "omitted"}, "messages": [user("Hello")]},
    ),
    MessagesShape(
        "two_thinking_blocks",
        {
            "messages": [
                user("2+2?"),
                assistant([thinking("First thought."), thinking(""), thinking("Second thought."), text("4")]),
                user("Times 3?"),
            ]
        },
    ),
    MessagesShape(
        "thinking_only_assistant",
        {"messages": [user("2+2?"), assistant([thinking("Just thinking.")]), user("Well?")]},
    ),
    MessagesShape("thinking_in_user", {"messages": [user([thinking("A user thought."), text("Hi")])]}),
    MessagesShape(
        "inline_system_blocks",
        {
            "system": [text(BILLING), text(SYSTEM_TEXT)],
            "messages": [
                user("Hi"),
                assistant("Hello!"),
                {"role": "system", "content": [text("  Reminder one.  "), text(" "), text("Reminder two.")]},
                user("Go on"),
            ],
        },
    ),
    MessagesShape(
        "inline_system_only_spaces",
        {"messages": [user("Hi"), {"role": "system", "content": "   "}, user("Go on")]},
    ),
    MessagesShape("system_only_spaces", {"system": "   ", "messages": [user("Hello")]}),
    MessagesShape("system_image_block", {"system": [IMAGE, text(SYSTEM_TEXT)], "messages": [user("Hello")]}),
    MessagesShape(
        "tool_result_image",
        {"tools": TOOLS, "messages": [ASK, CALL, user([tool_result("toolu_01", [text("A chart:"), IMAGE])])]},
    ),
    MessagesShape(
        "tool_result_references",
        {
            "tools": TOOLS,
            "messages": [
                ASK,
                CALL,
                user(
                    [
                        tool_result(
                            "toolu_01",
                            [
                                {"type": "tool_reference", "tool_name": "search_code"},
                                text("18 C"),
                                {"type": "tool_reference", "name": "get_weather"},
                            ],
                        )
                    ]
                ),
            ],
        },
    ),
    MessagesShape(
        "tool_result_search_result",
        {"tools": TOOLS, "messages": [ASK, CALL, user([tool_result("toolu_01", [SEARCH_RESULT])])]},
    ),
    MessagesShape(
        "tool_result_empty", {"tools": TOOLS, "messages": [ASK, CALL, user([tool_result("toolu_01", None)])]}
    ),
    MessagesShape("search_result_block", {"messages": [user([SEARCH_RESULT, text("Summarise.")])]}),
    MessagesShape(
        "assistant_tool_result",
        {
            "messages": [
                ASK,
                assistant([text("Earlier:"), tool_result("toolu_00", [text("17 C")])]),
                user("Now?"),
            ]
        },
    ),
    MessagesShape(
        "text_tool_result_text_image",
        {
            "tools": TOOLS,
            "messages": [
                ASK,
                CALL,
                user([text("Result:"), tool_result("toolu_01", "18 C"), text("And this:"), IMAGE]),
            ],
        },
    ),
    MessagesShape("empty_text_block", {"messages": [user("Hi"), assistant([text("")]), user("Hello?")]}),
    MessagesShape(
        "tool_use_without_input",
        {
            "tools": TOOLS,
            "messages": [
                ASK,
                assistant([{"type": "tool_use", "id": "toolu_01", "name": "get_weather"}]),
                user([tool_result("toolu_01", "18 C")]),
            ],
        },
    ),
    MessagesShape(
        "tool_use_null_input",
        {
            "tools": TOOLS,
            "messages": [
                ASK,
                assistant([{"type": "tool_use", "id": "toolu_01", "name": "x", "input": None}]),
            ],
        },
    ),
    MessagesShape(
        "tool_strict_deferred",
        {"tools": [{**WEATHER, "strict": True}, {**TOOLS[1], "defer_loading": True}], "messages": [ASK]},
    ),
    MessagesShape("tool_of_unknown_type", {"tools": [{**WEATHER, "type": "function"}], "messages": [ASK]}),
    MessagesShape("tool_without_schema", {"tools": [{"name": "get_weather"}], "messages": [ASK]}),
    MessagesShape("server_tool_and_custom", {"tools": [WEB_SEARCH, WEATHER], "messages": [ASK]}),
    MessagesShape(
        "server_tool_only_any", {"tools": [WEB_SEARCH], "tool_choice": {"type": "any"}, "messages": [ASK]}
    ),
    MessagesShape(
        "server_tool_wrong_name",
        {"tools": [{"type": "text_editor_20250124", "name": "editor"}], "messages": [ASK]},
    ),
    MessagesShape("tool_choice_auto_without_tools", {"tool_choice": {"type": "auto"}, "messages": [ASK]}),
    MessagesShape("tool_choice_none_without_tools", {"tool_choice": {"type": "none"}, "messages": [ASK]}),
    MessagesShape(
        "tool_choice_unknown_tool",
        {"tools": TOOLS, "tool_choice": {"type": "tool", "name": "nope"}, "messages": [ASK]},
    ),
    MessagesShape(
        "tool_choice_no_parallel",
        {
            "tools": TOOLS,
            "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
            "messages": [ASK],
        },
    ),
    MessagesShape(
        "unknown_fields_kept_out", {"betas": ["x-2025"], "metadata": {"user_id": "u"}, "messages": [ASK]}
    ),
    MessagesShape("text_block_without_text", {"messages": [user([{"type": "text"}])]}),
    MessagesShape(
        "tool_schema_invalid",
        {
            "tools": [{**WEATHER, "input_schema": {"type": "object", "properties": {"city": {"type": 5}}}}],
            "messages": [ASK],
        },
    ),
]
ALL_SHAPES = SHAPES + SGLANG_SHAPES


@cache
def _served(folder: str) -> ServedModel:
    return load_served_model(folder, "sglang")


def request_body(oracle: Oracle, shape: MessagesShape, endpoint: str) -> dict[str, Any]:
    body = {**shape.body, "model": str(oracle.model_dir)}
    return {**body, "max_tokens": 1} if endpoint == "messages" else body


def sglang_answer(oracle: Oracle, endpoint: str, body: dict[str, Any]) -> dict[str, Any]:
    """{"status": 200, "input_ids": [...]} or {"status": 400 | 500, "error": ...}, as SGLang answers."""
    return oracle.pipe.ask({"endpoint": endpoint, "body": body}, ANSWER_DEADLINE_SECONDS)


# Where islwatch and SGLang answer otherwise on purpose: (family, shape, endpoint) -> why.
# SGLang refuses, islwatch counts. The chat path's divergence (tests/sglang_server/sglang_shapes.py DIVERGES):
# SGLang refuses media on a text-only model by its architecture (`_validate_media_content`:
# ModelConfig.is_multimodal, from config.json), islwatch takes a template that mentions images, as Gemma 3's
# does, for a multimodal model's and counts. count_tokens never runs that check (`handle_count_tokens` calls
# `_process_messages` alone, not `_validate_request`): both count there.
COUNTED_NOT_REFUSED: dict[tuple[str, str, str], str] = {
    ("gemma-3", name, "messages"): "an image on a text-only Gemma 3 (config.json), counted"
    for name in ("image_block", "text_tool_result_text_image")
}
# SGLang counts, islwatch refuses: count_tokens skips `_validate_request`, so a tool whose parameters fail the
# JSON Schema metaschema is counted there; islwatch's chat path checks every tool's schema as /v1/messages
# does (core/flavors/sglang.py `_template_tools`) and says SGLang refuses.
REFUSED_NOT_COUNTED: dict[tuple[str, str, str], str] = {
    (family, "tool_schema_invalid", "count_tokens"): "an invalid tool schema on count_tokens, refused"
    for family in FAMILIES
}


@pytest.mark.parametrize("endpoint", ENDPOINTS)
@pytest.mark.parametrize("shape", ALL_SHAPES, ids=[s.name for s in ALL_SHAPES])
def test_messages_count_equals_sglang_input_ids(oracle: Oracle, shape: MessagesShape, endpoint: str) -> None:
    body = request_body(oracle, shape, endpoint)
    answer = sglang_answer(oracle, endpoint, body)
    result = _served(str(oracle.model_dir)).count(endpoint, body)
    if (oracle.family, shape.name, endpoint) in COUNTED_NOT_REFUSED:
        assert answer["status"] == 400, answer
        assert result.fallback_reason is None and result.expected_server is not None, result
        return
    if (oracle.family, shape.name, endpoint) in REFUSED_NOT_COUNTED:
        assert answer["status"] == 200, answer
        assert result.fallback_reason == SERVER_REFUSES, result
        return
    if answer["status"] == 200:
        assert result.fallback_reason is None, (result, answer)
        assert result.expected_server == len(answer["input_ids"]), answer
    else:
        assert answer["status"] == 400, answer
        assert result.fallback_reason == SERVER_REFUSES and result.expected_server is None, (result, answer)
        assert result.detail is not None and result.detail.startswith("sglang answers 400: "), result


def test_the_parser_modelled_is_the_servers(oracle: Oracle) -> None:
    """The Messages conversion depends on `--reasoning-parser` (thinking history, the thinking switch): the
    parser islwatch infers from the template is the one the oracle runs."""
    flags = FAMILIES[oracle.family]
    given = flags[flags.index("--reasoning-parser") + 1] if "--reasoning-parser" in flags else None
    assert documented_parser(_served(str(oracle.model_dir)).templates()[0]) == given
