"""The chat shapes run through SGLang's own preprocessing: the vLLM table's chat and refused shapes
(tests/vllm_server/vllm_shapes.py, imported), the vLLM oracle's agent shapes (tests/vllm_oracle/
oracle_shapes.py, imported: reasoning with tool calls, parallel calls, long loops, reasoning effort, thinking
off, developer role), the same agent traffic as SGLang clients send it (reasoning as `reasoning_content`, the
only reasoning field of SGLang's message model), plus shapes for the rules where SGLang departs from vLLM
(proxy/core/flavors/sglang.py). `REFUSED_BY_SGLANG` names the shapes SGLang 0.5.23 answers with a 400 or 500 on every
family; `REFUSED_BY_FAMILY` those one family's chat template (or SGLang's handling of the model) refuses.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from tests.vllm_oracle.oracle_shapes import (
    AGENT,
    AGENT_TOOLS,
    SYSTEM,
    THOUGHT,
    agent_loop,
    thinking,
    weather_call,
)
from tests.vllm_server.vllm_shapes import (
    ASK,
    CHAT,
    LONG,
    REFUSED,
    TIME,
    WEATHER,
    Shape,
    assistant_calls,
    call,
    chat,
    tool,
    user,
)

WEATHER_FN = WEATHER["function"]
DB_TOOL = {
    "type": "function",
    "function": {
        "name": "find_order",
        "description": "Look an order up.",
        "parameters": {
            "type": "object",
            "properties": {
                "order_id": {"type": "varchar(36)"},
                "quantity": {"type": "int"},
                "note": {"type": ["str", "null"]},
                "tags": {"type": "list[str]", "items": {"type": "text"}},
            },
        },
    },
}


def tools_shape(name: str, tools: list[dict[str, Any]], **body: Any) -> Shape:
    return chat(name, [ASK], tools=tools, **body)


SGLANG: list[Shape] = [
    chat(
        "final_assistant_not_continued", [user("Write a haiku."), {"role": "assistant", "content": "Autumn"}]
    ),
    chat(
        "final_assistant_tool_call",
        [ASK, assistant_calls(call("c1", '{"city": "Paris"}'))],
        tools=[WEATHER],
    ),
    chat(
        "continue_final_message_spaces",
        [user("Write a haiku."), {"role": "assistant", "content": "  Autumn leaves, "}],
        continue_final_message=True,
    ),
    chat(
        "continue_final_message_llama_style",
        [user("Hi"), {"role": "assistant", "content": "Hello"}],
        continue_final_message=True,
        add_generation_prompt=False,
    ),
    chat("role_in_capitals", [{"role": "System", "content": "Be brief."}, user("Hi")]),
    chat(
        "thinking_part",
        [
            user("Hi"),
            {
                "role": "assistant",
                "content": [{"type": "thinking", "thinking": "Hm."}, {"type": "text", "text": "Hello."}],
            },
            user("More"),
        ],
    ),
    chat(
        "tool_reference_part",
        [user([{"type": "text", "text": "Use it."}, {"type": "tool_reference", "name": "x"}])],
    ),
    chat("user_name_and_system_name", [{"role": "system", "content": "S", "name": "sys"}, user("Hi")]),
    chat("reasoning_effort", [user("Hi")], reasoning_effort="low"),
    chat("template_kwargs_reasoning_effort", [user("Hi")], chat_template_kwargs={"reasoning_effort": "high"}),
    chat("input_ids_extension", [user("Hi")], input_ids=[9707, 1879, 11, 374, 264]),
    chat(
        "message_tools_only",
        [{"role": "system", "content": "Sys", "tools": [TIME]}, user("What time is it?")],
    ),
    chat("long_parts", [user([{"type": "text", "text": LONG}, {"type": "text", "text": LONG[:500]}])]),
    tools_shape(
        "tool_choice_named_of_two",
        [WEATHER, TIME],
        tool_choice={"type": "function", "function": {"name": "get_time"}},
    ),
    tools_shape(
        "tool_keys_reordered",
        [
            {
                "type": "function",
                "function": {
                    "parameters": WEATHER_FN["parameters"],
                    "name": "get_weather",
                    "description": WEATHER_FN["description"],
                },
            }
        ],
    ),
    tools_shape("tool_defer_loading", [{**TIME, "defer_loading": True}]),
    tools_shape("tool_db_types", [DB_TOOL]),
    tools_shape("tool_type_not_function", [{**TIME, "type": "custom"}]),
    # Refused by SGLang (REFUSED_BY_SGLANG).
    chat("empty_messages", []),
    chat("tool_choice_required_without_tools", [ASK], tool_choice="required"),
    tools_shape("tool_choice_names_a_missing_tool", [WEATHER], tool_choice={"function": {"name": "nope"}}),
    tools_shape(
        "tool_unknown_schema_type",
        [{"type": "function", "function": {"name": "f", "parameters": {"type": "thing"}}}],
    ),
    tools_shape(
        "tool_parameters_not_a_schema", [{"type": "function", "function": {"name": "f", "parameters": "x"}}]
    ),
    chat("input_text_part", [user([{"type": "input_text", "text": "Hi"}])]),
    chat("thinking_part_in_user", [user([{"type": "thinking", "thinking": "Hm."}])]),
    chat("template_kwargs_tools", [user("Hi")], chat_template_kwargs={"tools": [TIME]}),
    chat("template_kwargs_tokenize", [user("Hi")], chat_template_kwargs={"tokenize": True}),
    chat(
        "template_kwargs_continue",
        [user("Hi"), {"role": "assistant", "content": "A"}],
        chat_template_kwargs={"continue_final_message": True},
    ),
    chat("template_kwargs_chat_template", [user("Hi")], chat_template_kwargs={"chat_template": "{{ 1 }}"}),
    chat(
        "empty_tool_call_arguments",
        [ASK, assistant_calls(call("c1", "")), {"role": "tool", "content": "x"}],
        tools=[WEATHER],
    ),
]


def with_reasoning_content(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages with vLLM's `reasoning` field renamed to `reasoning_content`, the field SGLang keeps."""
    return [{("reasoning_content" if k == "reasoning" else k): v for k, v in m.items()} for m in messages]


def sglang_loop(rounds: int, *, end_on_user: bool) -> list[dict[str, Any]]:
    return with_reasoning_content(agent_loop(rounds, end_on_user=end_on_user))


PARALLEL = [
    SYSTEM,
    ASK,
    thinking(
        THOUGHT,
        weather_call("c1", "Paris"),
        call("c2", '{"zone": "Asia/Tokyo"}', "get_time"),
        key="reasoning_content",
    ),
    tool("c1", "sunny, 21C"),
    tool("c2", "14:05"),
]
HISTORY = [user("Capital of France?"), thinking(THOUGHT, content="Paris.", key="reasoning_content")]

# Agent traffic as SGLang's clients send it back: reasoning as `reasoning_content`.
SGLANG_AGENT: list[Shape] = [
    chat("rc_agent_5_rounds_end_tool", sglang_loop(5, end_on_user=False), tools=AGENT_TOOLS),
    chat("rc_agent_5_rounds_end_user", sglang_loop(5, end_on_user=True), tools=AGENT_TOOLS),
    chat("rc_agent_20_rounds_end_tool", sglang_loop(20, end_on_user=False), tools=AGENT_TOOLS),
    chat("rc_agent_20_rounds_end_user", sglang_loop(20, end_on_user=True), tools=AGENT_TOOLS),
    chat("rc_parallel_tool_calls", PARALLEL, tools=AGENT_TOOLS),
    chat(
        "rc_parallel_tool_calls_then_user",
        [
            *PARALLEL,
            thinking("Both are in.", content="Sunny; 14:05.", key="reasoning_content"),
            user("And Rome?"),
        ],
        tools=AGENT_TOOLS,
    ),
    chat(
        "rc_parallel_tool_results_as_parts",
        [
            *PARALLEL[:3],
            tool("c1", [{"type": "text", "text": "sunny,"}, {"type": "text", "text": "21C"}]),
            tool("c2", "14:05"),
        ],
        tools=AGENT_TOOLS,
    ),
    chat(
        "rc_tool_calls_object_arguments",
        [
            SYSTEM,
            ASK,
            thinking(
                THOUGHT,
                {
                    **weather_call("c1", "Paris"),
                    "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
                },
                key="reasoning_content",
            ),
            tool("c1", "sunny"),
        ],
        tools=AGENT_TOOLS,
    ),
    chat(
        "rc_enable_thinking_false_loop",
        sglang_loop(5, end_on_user=True),
        tools=AGENT_TOOLS,
        chat_template_kwargs={"enable_thinking": False},
    ),
    chat("rc_thinking_false", [*HISTORY, user("And Italy?")], chat_template_kwargs={"thinking": False}),
    chat("rc_thinking_true", [*HISTORY, user("And Italy?")], chat_template_kwargs={"thinking": True}),
    chat("rc_reasoning_effort_none_history", [*HISTORY, user("And Italy?")], reasoning_effort="none"),
    chat(
        "rc_reasoning_effort_low_loop",
        sglang_loop(5, end_on_user=False),
        tools=AGENT_TOOLS,
        reasoning_effort="low",
    ),
    *[
        chat(f"reasoning_effort_{e}", [SYSTEM, user("Hi")], reasoning_effort=e)
        for e in ("xhigh", "max", "ultra")
    ],
    chat("reasoning_effort_number", [SYSTEM, user("Hi")], reasoning_effort=0.5),
    chat("reasoning_effort_number_string", [SYSTEM, user("Hi")], reasoning_effort="0.25"),
    chat("reasoning_object_effort", [SYSTEM, user("Hi")], reasoning={"effort": "high"}),
    chat("reasoning_object_enabled", [SYSTEM, user("Hi")], reasoning={"enabled": True}),
    chat(
        "template_kwargs_effort_low", [SYSTEM, user("Hi")], chat_template_kwargs={"reasoning_effort": "low"}
    ),
    chat(
        "template_kwargs_effort_over_request",
        [SYSTEM, user("Hi")],
        reasoning_effort="high",
        chat_template_kwargs={"reasoning_effort": "low"},
    ),
    chat(
        "template_kwargs_effort_none", [SYSTEM, user("Hi")], chat_template_kwargs={"reasoning_effort": "none"}
    ),
    chat(
        "developer_with_reasoning_history",
        [{"role": "developer", "content": "Answer in French."}, *HISTORY, user("And Italy?")],
    ),
    chat(
        "developer_agent_loop",
        [{"role": "developer", "content": "Use the tools."}, *sglang_loop(5, end_on_user=False)[1:]],
        tools=AGENT_TOOLS,
    ),
    chat("system_twice", [SYSTEM, user("Hi"), {"role": "system", "content": "Be brief."}, user("Again")]),
    chat(
        "reasoning_content_null",
        [user("Q"), {"role": "assistant", "content": "A", "reasoning_content": None}, user("Q2")],
    ),
    chat(
        "tool_call_id_mismatch",
        [SYSTEM, ASK, assistant_calls(weather_call("c1", "Paris")), tool("other", "sunny")],
        tools=AGENT_TOOLS,
    ),
    chat("tool_result_without_call", [SYSTEM, ASK, tool("c9", "sunny")], tools=AGENT_TOOLS),
    chat(
        "tool_call_json_args_spaces",
        [
            SYSTEM,
            ASK,
            assistant_calls(call("c1", json.dumps({"city": "Paris", "days": [1, 2.5]}, indent=2))),
            tool("c1", "sunny"),
        ],
        tools=AGENT_TOOLS,
    ),
]

AGENT_CHAT = [s for s in AGENT if s.endpoint == "chat"]
SHAPES: list[Shape] = [s for s in CHAT + REFUSED if s.endpoint == "chat"] + SGLANG + AGENT_CHAT + SGLANG_AGENT
REFUSED_BY_SGLANG = {
    # from the vLLM table
    "unknown_role",  # not a role of ChatCompletionMessageParam
    "user_null_content",  # ChatCompletionMessageUserParam.content is required
    "image_on_text_model",  # _validate_media_content
    "tool_round_trip_invalid_json_args",  # normalize_assistant_tool_call_arguments(strict=True)
    "tool_round_trip_non_object_args",
    "template_kwargs_repeat_flag",  # apply_chat_template(add_generation_prompt=...) twice: a 500
    # SGLang's own
    "empty_messages",
    "tool_choice_required_without_tools",
    "tool_choice_names_a_missing_tool",
    "tool_unknown_schema_type",  # Draft202012Validator.check_schema
    "tool_parameters_not_a_schema",
    "input_text_part",
    "thinking_part_in_user",
    "template_kwargs_tools",
    "template_kwargs_tokenize",
    "template_kwargs_continue",
    "template_kwargs_chat_template",
    "empty_tool_call_arguments",
    "reasoning_effort_extreme",  # not a ReasoningEffortType tier
    "null_ignore_eos",  # ChatCompletionRequest fields typed without None (as vLLM's: its table)
    "null_echo_and_min_tokens",  # min_tokens (echo is not a field of SGLang's)
}


def rendered_messages(shape: Shape) -> list[dict[str, Any]]:
    """The messages SGLang hands the template (roles lower-cased), after `_handle_last_assistant_message`: a
    final assistant message whose content is not a part list (None is "" by then) becomes a user message."""
    messages = [{**m, "role": m["role"].lower()} for m in shape.body["messages"]]
    last = messages[-1] if messages else {}
    continued = shape.body.get("continue_final_message")
    if last.get("role") == "assistant" and not isinstance(last.get("content"), list) and not continued:
        messages[-1] = {"role": "user", "content": last.get("content") or ""}
    return messages


def _call_lists(shape: Shape) -> list[list[Any]]:
    """The `tool_calls` of every assistant message the template renders (SGLang drops a null list)."""
    return [
        m["tool_calls"]
        for m in rendered_messages(shape)
        if m["role"] == "assistant" and m.get("tool_calls") is not None
    ]


def _gemma_out_of_turn(shape: Shape) -> bool:
    """Gemma 3's template, after a leading system message: `(role == 'user') != (index is even)` raises."""
    messages = rendered_messages(shape)
    if messages and messages[0]["role"] == "system":
        messages = messages[1:]
    return any((m["role"] == "user") != (i % 2 == 0) for i, m in enumerate(messages))


# Shapes one family's chat template refuses under SGLang (jinja2's errors and TypeErrors: 400), beyond
# REFUSED_BY_SGLANG. gpt-oss's by name: its template reads the first tool call and tool's schema.
GPT_OSS_REFUSED = {
    "empty_tool_calls",  # "list object has no element 0": tool_calls of length 0
    "tools_minimal",  # a tool without parameters
    "tool_result_without_call",  # "Message has tool role, but there was no previous ... tool call"
    "reasoning_effort_number",  # "Reasoning: " + a float
    "reasoning_effort_number_string",  # the request model makes "0.25" a float
    "template_kwargs_effort_none",  # _convert_to_internal_request: "Harmony does not support ... none"
}
REFUSED_BY_FAMILY: dict[str, Callable[[Shape], bool]] = {
    # "This model only supports single tool-calls at once!"
    "llama-3.1": lambda shape: any(len(calls) != 1 for calls in _call_lists(shape)),
    "gemma-3": _gemma_out_of_turn,  # "Conversation roles must alternate user/assistant/..."
    # '```json\n' + arguments: SGLang parsed every call's arguments to an object (TypeError)
    "deepseek-r1": lambda shape: any(calls for calls in _call_lists(shape)),
    "gpt-oss": lambda shape: shape.name in GPT_OSS_REFUSED,
}


def refused_by(family: str, shape: Shape) -> bool:
    """Whether SGLang 0.5.23 refuses the shape (400 or 500) on this family."""
    return shape.name in REFUSED_BY_SGLANG or REFUSED_BY_FAMILY.get(family, lambda _: False)(shape)


# Where islwatch's count and SGLang's answer differ, on purpose: (family, shape) -> SGLang's rule and why
# islwatch does not follow it. Asserted as a divergence by the tests.
DIVERGES: dict[tuple[str, str], str] = {
    ("gemma-3", "image_on_text_model"): (
        "SGLang refuses media on a text-only model by its architecture (_validate_media_content: "
        "ModelConfig.is_multimodal, from config.json); the counting core sees no config.json and takes a "
        "template that mentions images, as Gemma 3's does, for a multimodal model's: it counts the text"
    ),
}
