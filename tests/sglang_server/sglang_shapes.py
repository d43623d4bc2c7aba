"""The chat shapes run through SGLang's own preprocessing: the vLLM table's chat and refused shapes
(tests/vllm_server/vllm_shapes.py, imported), plus shapes for the rules where SGLang departs from vLLM
(proxy/core/sglang.py). `REFUSED_BY_SGLANG` names the shapes SGLang 0.5.23 answers with a 400 or 500.
"""

from __future__ import annotations

from typing import Any

from vllm_server.vllm_shapes import (
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

SHAPES: list[Shape] = [s for s in CHAT + REFUSED if s.endpoint == "chat"] + SGLANG
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
}
