"""Chat shapes for llama-server on the modern families (Qwen3, gpt-oss): the interop chat shapes, the agent
shapes the vLLM oracle runs (tests/vllm_oracle/oracle_shapes.py: reasoning with tool calls, parallel calls,
5 and 20 rounds, reasoning effort, thinking off, developer role), and one shape per llama.cpp rule that
core/flavors/llama_cpp.py models, each naming it. `status` is llama-server's answer: 200, or the 400 / 500 islwatch
predicts as `server_would_refuse` / `invalid_body`. Bodies carry only what shapes the prompt.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tests.interop.interop_shapes import CHAT as INTEROP_CHAT
from tests.vllm_oracle.oracle_shapes import AGENT, AGENT_TOOLS, ASK, SYSTEM, THOUGHT, thinking, weather_call
from tests.vllm_server.vllm_shapes import tool as tool_result
from tests.vllm_server.vllm_shapes import user

QWEN3 = "qwen3"
GPT_OSS = "gpt-oss"


@dataclass(frozen=True)
class ModernShape:
    name: str
    body: dict[str, Any]
    status: int = 200


def assistant(content: Any, **fields: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": content, **fields}


def _call(args: Any) -> dict[str, Any]:
    return {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": args}}


_CALL_TURN = [ASK, assistant(None, tool_calls=[weather_call("c1", "Paris")])]

RULES: list[ModernShape] = [
    # gpt-oss.cpp: reasoning_content becomes `thinking` and the content of that tool-call turn is erased
    # (gpt-oss's template raises on both); Qwen3 writes both.
    ModernShape(
        "content_and_reasoning_content_with_tool_calls",
        {
            "messages": [
                SYSTEM,
                ASK,
                thinking(
                    THOUGHT, weather_call("c1", "Paris"), content="Let me check.", key="reasoning_content"
                ),
                tool_result("c1", "sunny"),
            ],
            "tools": AGENT_TOOLS,
        },
    ),
    # common_chat_msgs_parse_oaicompat reads no `thinking`: a client's own is dropped.
    ModernShape(
        "thinking_field_dropped",
        {
            "messages": [
                SYSTEM,
                ASK,
                assistant(None, thinking=THOUGHT, tool_calls=[weather_call("c1", "Paris")]),
                tool_result("c1", "sunny"),
            ],
            "tools": AGENT_TOOLS,
        },
    ),
    # oaicompat_chat_params_parse: a final assistant message is continued, even with an explicit false;
    # gpt-oss.cpp writes the continued turn's analysis channel first, reasoning or not.
    ModernShape(
        "prefill_with_continue_false",
        {"messages": [user("Hi"), assistant("Hel")], "continue_final_message": False},
    ),
    ModernShape(
        "prefill_explicit",
        {
            "messages": [user("Hi"), assistant("Hel")],
            "continue_final_message": True,
            "add_generation_prompt": False,
        },
    ),
    ModernShape(
        "prefill_reasoning_and_content",
        {"messages": [user("Capital of France?"), assistant("Paris", reasoning_content=THOUGHT)]},
    ),
    # COMMON_CHAT_CONTINUATION_REASONING: reasoning and no content continues the reasoning itself.
    ModernShape(
        "prefill_reasoning_only",
        {"messages": [user("Capital of France?"), assistant("", reasoning_content=THOUGHT)]},
    ),
    ModernShape(
        "prefill_reasoning_null_content",
        {"messages": [user("Capital of France?"), assistant(None, reasoning_content=THOUGHT)]},
    ),
    ModernShape(
        "prefill_continue_reasoning_content",
        {
            "messages": [user("Hi"), assistant("Hel", reasoning_content=THOUGHT)],
            "continue_final_message": "reasoning_content",
            "add_generation_prompt": False,
        },
    ),
    # common_chat_templates_init: gpt-oss's "<|channel|> in content" check is patched out of its template.
    ModernShape(
        "channel_tags_in_assistant_content",
        {"messages": [user("Hi"), assistant("see <|channel|>final<|message|> here"), user("ok")]},
    ),
    # to_json_oaicompat: empty tool_calls and an empty reasoning_content are left out.
    ModernShape(
        "empty_tool_calls", {"messages": [user("Hi"), assistant("Hello", tool_calls=[]), user("ok")]}
    ),
    ModernShape(
        "empty_reasoning_content",
        {"messages": [user("Hi"), assistant("Hello", reasoning_content=""), user("ok")]},
    ),
    # common_chat_msgs_parse_oaicompat dumps object arguments; func_args_not_string parses them back.
    ModernShape(
        "object_arguments",
        {
            "messages": [
                ASK,
                assistant(None, tool_calls=[_call({"city": "Paris", "n": 2.5})]),
                tool_result("c1", "ok"),
            ],
            "tools": AGENT_TOOLS,
        },
    ),
    # concat_content_parts: no "\n" before a first text while the text is empty.
    ModernShape(
        "tool_result_parts_leading_empty",
        {
            "messages": [
                *_CALL_TURN,
                tool_result("c1", [{"type": "text", "text": ""}, {"type": "text", "text": "sunny"}]),
            ],
            "tools": AGENT_TOOLS,
        },
    ),
    # map_developer_role_to_system (not for gpt-oss), without vLLM's merge of system messages.
    ModernShape(
        "developers_not_merged",
        {
            "messages": [
                {"role": "developer", "content": "Answer in French."},
                user("Hi"),
                {"role": "developer", "content": "Be brief."},
                user("ok"),
            ]
        },
    ),
    ModernShape(
        "second_system_message",
        {"messages": [SYSTEM, user("Hi"), {"role": "system", "content": "Be brief."}, user("ok")]},
    ),
    # reasoning_effort: "none" turns thinking off (the kwargs' own enable_thinking still wins in the
    # template's context); another effort is the template kwarg, over the kwargs' own.
    ModernShape(
        "effort_none_with_enable_thinking_true",
        {
            "messages": [user("Hi")],
            "reasoning_effort": "none",
            "chat_template_kwargs": {"enable_thinking": True},
        },
    ),
    ModernShape(
        "effort_kwarg_high", {"messages": [user("Hi")], "chat_template_kwargs": {"reasoning_effort": "high"}}
    ),
    ModernShape(
        "effort_low_over_kwarg_high",
        {
            "messages": [user("Hi")],
            "reasoning_effort": "low",
            "chat_template_kwargs": {"reasoning_effort": "high"},
        },
    ),
    # oaicompat_chat_params_parse's 400s.
    ModernShape(
        "two_assistant_messages_at_the_end",
        {"messages": [user("Hi"), assistant("a"), assistant("b")]},
        status=400,
    ),
    ModernShape("user_without_content", {"messages": [{"role": "user"}]}, status=400),
    ModernShape(
        "assistant_without_content_or_tool_calls",
        {"messages": [user("Hi"), {"role": "assistant"}, user("ok")]},
        status=400,
    ),
    ModernShape(
        "continue_with_generation_prompt",
        {"messages": [user("Hi"), assistant("Hel")], "continue_final_message": True},
        status=400,
    ),
    ModernShape("continue_tool_call_turn", {"messages": _CALL_TURN, "tools": AGENT_TOOLS}, status=400),
    ModernShape(
        "enable_thinking_string",
        {"messages": [user("Hi")], "chat_template_kwargs": {"enable_thinking": "false"}},
        status=400,
    ),
    # func_args_not_string: arguments that are not JSON are a 500 for templates that read objects.
    ModernShape(
        "arguments_not_json",
        {
            "messages": [
                *_CALL_TURN[:1],
                assistant(None, tool_calls=[_call("not json")]),
                tool_result("c1", "ok"),
            ]
        },
        status=500,
    ),
]

SHAPES: list[ModernShape] = [
    *(ModernShape(s.name, s.body) for s in INTEROP_CHAT),
    *(ModernShape(f"oracle_{s.name}", s.body) for s in AGENT if s.endpoint == "chat"),
    *RULES,
]
assert len({s.name for s in SHAPES}) == len(SHAPES), "shape names are test ids"
