"""islwatch's count of Anthropic Messages requests (`/v1/messages`, `/v1/messages/count_tokens`) against vLLM's
own code (the oracle, tests/vllm_oracle/vllm_oracle.py: the body validated by vLLM's AnthropicMessagesRequest /
AnthropicCountTokensRequest, converted by `AnthropicServingMessages.to_chat_completion_request` with the
server's own start-up probes, rendered as the chat it becomes), on both releases and every family the
oracle fixture serves: where vLLM answers, islwatch's count is the length of vLLM's prompt token ids; where
vLLM refuses the request, islwatch says so.

The shapes: every one of tests/anthropic_shapes.py, and CONVERSIONS here, the conversion's paths those do not
reach, read off `anthropic/serving.py` (tool_addition / tool_removal blocks, inline system blocks, tool
results with images or tool references, an assistant's tool_result, output_config, adaptive thinking,
sampling fields), each on both endpoints. VALIDATIONS are the request models' refusals (and what they let
through: pydantic's lax coercions), put to one family, since no template is reached.

Where islwatch does not count as vLLM does for a reason outside the conversion's port, the difference is
asserted as it is (DIVERGENCES), never skipped: a fix on either side fails the test and moves the shape back
to the plain check. They are the same on both releases:
- a named tool_choice that names no declared tool: vLLM refuses it on Jinja templates and Harmony (the tool
  parser's adjust_request: `Tool 'x' has not been passed in tools`, xgrammar's structural tag), but serves
  it through mistral-common, whose tool parser builds no schema from it; islwatch refuses it on every
  family (the conversion does not know which renderer serves the model).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from proxy.core.count import SERVER_REFUSES, CountResult
from proxy.core.model import ServedModel, load_served_model
from proxy.core.server_settings import ServerSettings
from tests.anthropic_shapes import (
    ASK,
    BILLING,
    CALL,
    PNG_1PX,
    SEARCH,
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
from tests.vllm_oracle.oracle_proc import Oracle
from tests.vllm_oracle.test_vllm_oracle import START_DATE, assert_as_vllm

pytestmark = pytest.mark.vllm
ENDPOINTS = ("messages", "count_tokens")
MAX_TOKENS = 4096  # what a client sends with /v1/messages (more than the shapes' thinking budget)
FAMILY = "qwen3"  # the request models' refusals: any family both releases serve


def system_message(*blocks: dict[str, Any]) -> dict[str, Any]:
    return {"role": "system", "content": list(blocks)}


def reference(name: str) -> dict[str, Any]:
    return {"type": "tool_reference", "name": name}


def definition(tool: dict[str, Any]) -> dict[str, Any]:
    return {"type": "tool_definition", "definition": tool}


def addition(tool: dict[str, Any]) -> dict[str, Any]:
    return {"type": "tool_addition", "tool": tool}


def removal(tool: dict[str, Any]) -> dict[str, Any]:
    return {"type": "tool_removal", "tool": tool}


IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG_1PX}}
RESULT = user([tool_result("toolu_01", "18 C")])
SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}}}

CONVERSIONS = [
    MessagesShape(
        "tool_addition_by_reference",
        {
            "tools": [WEATHER, {**SEARCH, "defer_loading": True}],
            "messages": [system_message(addition(reference("search_code"))), ASK],
        },
    ),
    MessagesShape(
        "tool_addition_by_definition",
        {"tools": [WEATHER], "messages": [ASK, CALL, system_message(addition(definition(SEARCH))), RESULT]},
    ),
    MessagesShape(
        "tool_addition_without_tools", {"messages": [system_message(addition(definition(WEATHER))), ASK]}
    ),
    MessagesShape(
        "tool_removal",
        {"tools": TOOLS, "messages": [ASK, CALL, system_message(removal(reference("search_code"))), RESULT]},
    ),
    MessagesShape(
        "tool_removal_then_addition",
        {
            "tools": TOOLS,
            "messages": [
                system_message(removal(reference("get_weather"))),
                ASK,
                CALL,
                system_message(text("Weather is back."), addition(reference("get_weather"))),
                RESULT,
            ],
        },
    ),
    MessagesShape(
        "tool_change_undeclared",
        {"tools": [WEATHER], "messages": [system_message(addition(reference("search_code"))), ASK]},
    ),
    MessagesShape(
        "tool_removal_by_definition",
        {"tools": TOOLS, "messages": [system_message(removal(definition(SEARCH))), ASK]},
    ),
    MessagesShape(
        "tool_change_in_user_message", {"tools": TOOLS, "messages": [user([addition(reference("x"))])]}
    ),
    MessagesShape(
        "tool_change_in_top_system",
        {"tools": TOOLS, "system": [addition(reference("get_weather"))], "messages": [ASK]},
    ),
    MessagesShape(
        "inline_system_blocks_with_billing_header",
        {
            "messages": [
                user("Hi"),
                assistant("Hello!"),
                system_message(text(BILLING), text("Reminder: "), text("be brief.")),
                user("Go on"),
            ]
        },
    ),
    MessagesShape(
        "inline_system_billing_header_only",
        {
            "system": SYSTEM_TEXT,
            "messages": [user("Hi"), {"role": "system", "content": BILLING}, user("Go on")],
        },
    ),
    MessagesShape(
        "leading_system_message_and_top_system",
        {"system": SYSTEM_TEXT, "messages": [{"role": "system", "content": "Be brief."}, user("Hi")]},
    ),
    MessagesShape(
        "leading_system_message_only", {"messages": [{"role": "system", "content": "Be brief."}, user("Hi")]}
    ),
    MessagesShape("empty_system_string", {"system": "", "messages": [user("Hi")]}),
    MessagesShape("empty_system_list", {"system": [], "messages": [user("Hi")]}),
    MessagesShape(
        "tool_result_with_image",
        {"tools": TOOLS, "messages": [ASK, CALL, user([tool_result("toolu_01", [text("A map:"), IMAGE])])]},
    ),
    MessagesShape(
        "tool_result_with_tool_reference",
        {
            "tools": TOOLS,
            "messages": [
                ASK,
                CALL,
                user(
                    [
                        tool_result(
                            "toolu_01",
                            [text("Found it."), {"type": "tool_reference", "tool_name": "search_code"}],
                        )
                    ]
                ),
            ],
        },
    ),
    MessagesShape(
        "tool_result_without_content",
        {"tools": TOOLS, "messages": [ASK, CALL, user([{"type": "tool_result", "tool_use_id": "toolu_01"}])]},
    ),
    MessagesShape(
        "tool_result_is_error",
        {
            "tools": TOOLS,
            "messages": [ASK, CALL, user([{**tool_result("toolu_01", "city not found"), "is_error": True}])],
        },
    ),
    MessagesShape(
        "assistant_tool_result",
        {
            "tools": TOOLS,
            "messages": [
                ASK,
                assistant([text("Done."), tool_result("toolu_01", [text("18 C")])]),
                user("Thanks"),
            ],
        },
    ),
    MessagesShape(
        "user_tool_reference_only",
        {
            "tools": TOOLS,
            "messages": [ASK, CALL, RESULT, user([{"type": "tool_reference", "tool_name": "x"}])],
        },
    ),
    MessagesShape("assistant_empty_text", {"messages": [user("Hi"), assistant([text("")]), user("Hello?")]}),
    MessagesShape(
        "thinking_empty", {"messages": [user("2+2?"), assistant([thinking(""), text("4")]), user("Times 3?")]}
    ),
    MessagesShape("no_messages", {"system": SYSTEM_TEXT, "messages": []}),
    MessagesShape("user_image_only", {"messages": [user([IMAGE])]}),
    MessagesShape(
        "tool_choice_auto_no_parallel",
        {
            "tools": TOOLS,
            "tool_choice": {"type": "auto", "disable_parallel_tool_use": True},
            "messages": [ASK],
        },
    ),
    MessagesShape("tools_empty", {"tools": [], "messages": [ASK]}),
    MessagesShape(
        "tool_removal_of_every_tool",
        {
            "tools": [WEATHER],
            "messages": [ASK, CALL, system_message(removal(reference("get_weather"))), RESULT],
        },
    ),
    MessagesShape(
        "tool_choice_named_undeclared",
        {"tools": [WEATHER], "tool_choice": {"type": "tool", "name": "search_code"}, "messages": [ASK]},
    ),
    MessagesShape("tool_choice_auto_without_tools", {"tool_choice": {"type": "auto"}, "messages": [ASK]}),
    MessagesShape(
        "tool_choice_named_without_tools",
        {"tool_choice": {"type": "tool", "name": "get_weather"}, "messages": [ASK]},
    ),
    MessagesShape("tool_choice_any_without_tools", {"tool_choice": {"type": "any"}, "messages": [ASK]}),
    MessagesShape("tool_choice_none_without_tools", {"tool_choice": {"type": "none"}, "messages": [ASK]}),
    MessagesShape("output_config_effort", {"output_config": {"effort": "high"}, "messages": [user("Hello")]}),
    MessagesShape(
        "output_config_format",
        {"output_config": {"format": {"type": "json_schema", "schema": SCHEMA}}, "messages": [user("Hello")]},
    ),
    MessagesShape("thinking_adaptive", {"thinking": {"type": "adaptive"}, "messages": [user("Hello")]}),
    MessagesShape(
        "thinking_disabled_over_effort",
        {"thinking": {"type": "disabled"}, "output_config": {"effort": "max"}, "messages": [user("Hello")]},
    ),
    MessagesShape(
        "chat_template_kwargs",
        {"chat_template_kwargs": {"enable_thinking": False}, "messages": [user("Hello")]},
    ),
    MessagesShape(
        "sampling_fields",
        {
            "temperature": 0.2,
            "top_p": 0.9,
            "top_k": 40,
            "stop_sequences": ["\n\nHuman:"],
            "metadata": {"user_id": "u-1"},
            "stream": False,
            "messages": [user("Hello")],
        },
    ),
]


def validation(name: str, **patch: Any) -> MessagesShape:
    return MessagesShape(name, {"messages": [user("Hi")], **patch})


def message_blocks(*blocks: dict[str, Any], role: str = "user") -> list[dict[str, Any]]:
    return [{"role": role, "content": list(blocks)}]


VALIDATIONS = [
    validation("max_tokens_numeric_string", max_tokens="4096"),
    validation("max_tokens_integral_float", max_tokens=4096.0),
    validation("max_tokens_fractional", max_tokens=4096.5),
    validation("max_tokens_true", max_tokens=True),
    validation("max_tokens_zero", max_tokens=0),
    validation("max_tokens_missing_value", max_tokens=None),
    validation("budget_numeric_string", thinking={"type": "enabled", "budget_tokens": "2048"}),
    validation("budget_equals_max_tokens", thinking={"type": "enabled", "budget_tokens": MAX_TOKENS}),
    validation(
        "budget_over_max_tokens_remote_decode",
        thinking={"type": "enabled", "budget_tokens": 8192},
        kv_transfer_params={"do_remote_decode": True},
    ),
    validation("thinking_display", thinking={"type": "adaptive", "display": "omitted"}),
    validation("thinking_display_unknown", thinking={"type": "adaptive", "display": "full"}),
    validation("thinking_disabled_extra_key", thinking={"type": "disabled", "budget_tokens": 5}),
    validation("thinking_not_object", thinking="disabled"),
    validation("temperature_string", temperature="hot"),
    validation("temperature_numeric_string", temperature="0.5"),
    validation("top_k_fractional", top_k=1.5),
    validation("top_p_null", top_p=None),
    validation("stream_word", stream="yes"),
    validation("stream_unknown_word", stream="maybe"),
    validation("stop_sequences_number", stop_sequences=[1]),
    validation("stop_sequences_string", stop_sequences="stop"),
    validation("cache_salt_empty", cache_salt=""),
    validation("metadata_string", metadata="x"),
    validation("kv_transfer_params_list", kv_transfer_params=[]),
    validation("vllm_xargs_nested", vllm_xargs={"a": {"b": 1}}),
    validation("vllm_xargs_flat", vllm_xargs={"a": 1, "b": ["x", 2.5]}),
    validation("watermarking_word", watermarking="no"),
    validation("mm_payload_unknown", mm_payload="pixels"),
    validation("chat_template_kwargs_string", chat_template_kwargs="x"),
    validation("model_empty", model=""),
    validation("model_number", model=5),
    validation("messages_not_list", messages={"role": "user", "content": "Hi"}),
    validation("message_content_null", messages=[{"role": "user", "content": None}]),
    validation("message_extra_key", messages=[{"role": "user", "content": "Hi", "name": "bob"}]),
    validation("system_number", system=5),
    validation("system_unknown_block", system=[{"type": "video"}]),
    validation("text_number", messages=message_blocks({"type": "text", "text": 5})),
    validation("image_source_string", messages=message_blocks({"type": "image", "source": "x"})),
    validation(
        "tool_result_content_number",
        messages=message_blocks({"type": "tool_result", "tool_use_id": "a", "content": 5}),
    ),
    validation(
        "tool_result_content_list_of_strings",
        messages=message_blocks({"type": "tool_result", "tool_use_id": "a", "content": ["x"]}),
    ),
    validation(
        "tool_result_is_error_word",
        messages=message_blocks(
            {"type": "tool_result", "tool_use_id": "a", "content": "x", "is_error": "maybe"}
        ),
    ),
    validation(
        "thinking_signature_number",
        messages=[
            user("Hi"),
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "t", "signature": 5}]},
        ],
    ),
    validation(
        "redacted_thinking_data_number",
        messages=[user("Hi"), {"role": "assistant", "content": [{"type": "redacted_thinking", "data": 5}]}],
    ),
    validation(
        "tool_use_input_list",
        messages=[
            user("Hi"),
            {"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "n", "input": []}]},
        ],
    ),
    validation(
        "tool_reference_tool_name_number",
        messages=message_blocks({"type": "tool_reference", "tool_name": 5}),
    ),
    validation(
        "tool_change_reference_without_name",
        messages=[system_message(addition({"type": "tool_reference"})), user("Hi")],
    ),
    validation(
        "tool_change_unknown_type",
        messages=[system_message(addition({"type": "tool_group", "name": "x"})), user("Hi")],
    ),
    validation(
        "tool_change_definition_without_schema",
        messages=[system_message(addition(definition({"name": "x"}))), user("Hi")],
    ),
    validation("tool_description_number", tools=[{"name": "x", "description": 5, "input_schema": {}}]),
    validation("tool_strict_word", tools=[{"name": "x", "strict": "maybe", "input_schema": {}}]),
    validation("tool_defer_loading_word", tools=[{"name": "x", "defer_loading": "yes", "input_schema": {}}]),
    validation("tools_not_list", tools={"name": "x", "input_schema": {}}),
    validation(
        "tool_choice_parallel_word",
        tools=TOOLS,
        tool_choice={"type": "auto", "disable_parallel_tool_use": "maybe"},
    ),
    validation("tool_choice_name_number", tools=TOOLS, tool_choice={"type": "tool", "name": 5}),
    validation("output_config_format_text", output_config={"format": {"type": "text"}}),
    validation("output_config_effort_null", output_config={"effort": None}),
    validation("output_config_not_object", output_config="high"),
]


@dataclass(frozen=True)
class Divergence:
    islwatch: str | None  # islwatch's fallback_reason (None: it counts)
    vllm_status: int = 200
    short_by: int = 0  # where both count: vLLM's count minus islwatch's


DIVERGENCES: dict[tuple[str, str], Divergence] = {
    ("tool_choice_named_undeclared", "mistral-nemo"): Divergence(SERVER_REFUSES),
    ("tool_choice_named_undeclared", "mistral-large-2411"): Divergence(SERVER_REFUSES),
}


@cache
def _served(folder: str) -> ServedModel:
    # The oracles' environment passes VLLM_SYSTEM_START_DATE through (oracle_proc.launch): the same date here.
    return load_served_model(folder, "vllm", ServerSettings(harmony_start_date=START_DATE))


def islwatch_count(folder: Path, endpoint: str, body: dict[str, Any]) -> CountResult:
    """islwatch's public counting API on the folder vLLM serves (the one line to change when it moves)."""
    return _served(str(folder)).count(endpoint, body, False)


def islwatch_probes(folder: Path) -> dict[str, Any]:
    """What islwatch's start-up probes answered for the folder, by the oracle's names (core/flavors/vllm.py
    VllmFlavor.messages_as_chat's keys)."""
    probes = _served(str(folder)).probes
    names = {
        "merge_inline_system": "vllm.merge_inline_system",
        "disabled_thinking_effort": "vllm.disabled_thinking_effort",
    }
    return {name: probes[key] for name, key in names.items() if key in probes}


def request_body(oracle: Oracle, endpoint: str, shape: MessagesShape) -> dict[str, Any]:
    """The shape as a client sends it: the served model's name, and for /v1/messages an output limit (the
    shape's own when it has one)."""
    limit = {"max_tokens": MAX_TOKENS} if endpoint == "messages" else {}
    return {"model": str(oracle.model_dir), **limit, **shape.body}


def vllm_answer(oracle: Oracle, endpoint: str, body: dict[str, Any]) -> dict[str, Any]:
    """vLLM's answer; a body with a model of its own (a refusal) goes to the family's process as it is
    (Oracle.answer names the family's folder)."""
    if body["model"] == str(oracle.model_dir):
        return oracle.answer(endpoint, body)
    return oracle.process.ask(endpoint, body)


def assert_counts_as_vllm(oracle: Oracle, endpoint: str, shape: MessagesShape) -> dict[str, Any]:
    body = request_body(oracle, endpoint, shape)
    answer = vllm_answer(oracle, endpoint, body)
    result = islwatch_count(oracle.model_dir, endpoint, body)
    assert_as_vllm(result, answer)
    return answer


@pytest.mark.parametrize("endpoint", ENDPOINTS)
@pytest.mark.parametrize("shape", SHAPES + CONVERSIONS, ids=[s.name for s in SHAPES + CONVERSIONS])
def test_count_equals_vllm_prompt(oracle: Oracle, shape: MessagesShape, endpoint: str) -> None:
    divergence = DIVERGENCES.get((shape.name, oracle.family))
    if divergence is None:
        assert_counts_as_vllm(oracle, endpoint, shape)
        return
    body = request_body(oracle, endpoint, shape)
    answer = vllm_answer(oracle, endpoint, body)
    result = islwatch_count(oracle.model_dir, endpoint, body)
    assert answer["status"] == divergence.vllm_status, answer.get("error", "")[:200]
    assert result.fallback_reason == divergence.islwatch, result.detail
    if divergence.islwatch is None:
        vllm = sum(len(ids) for ids in answer["prompts"])
        assert (result.expected_server or 0) + divergence.short_by == vllm, (result.expected_server, vllm)


@pytest.mark.parametrize("endpoint", ENDPOINTS)
@pytest.mark.parametrize("case", VALIDATIONS, ids=[s.name for s in VALIDATIONS])
def test_refuses_as_vllms_request_models(
    oracles: dict[str, Oracle], case: MessagesShape, endpoint: str
) -> None:
    assert_counts_as_vllm(oracles[FAMILY], endpoint, case)


def test_start_up_probes_answer_as_vllms(oracle: Oracle) -> None:
    """Whether inline system messages are merged into the leading one, and the effort `thinking: disabled`
    becomes: islwatch's probes (core/flavors/vllm.py) answer as the server's (AnthropicServingMessages
    `_should_merge_inline_system`, and 0.32's `_probe_disabled_thinking_effort` / 0.33's
    DisabledThinkingEffortResolver), whether or not the two answers change the count of a shape."""
    shape = MessagesShape("probe", {"thinking": {"type": "disabled"}, "messages": [user("Hello")]})
    answer = assert_counts_as_vllm(oracle, "count_tokens", shape)
    assert islwatch_probes(oracle.model_dir) == answer["anthropic"]
