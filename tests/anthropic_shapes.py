"""Anthropic Messages request shapes (`/v1/messages`, `/v1/messages/count_tokens`) as coding agents send them:
system blocks (and Claude Code's billing header), thinking and redacted thinking, tool_use / tool_result with
mixed text, parallel tools, images, tool_choice any/none/named, empty content, long agent loops. Put to each
server's own conversion (tests/vllm_oracle, tests/sglang_server, tests/interop); which of them a server
refuses is its answer, not a flag here. Bodies carry only what shapes the prompt; tests add the model and
`max_tokens`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

PNG_1PX = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="


@dataclass(frozen=True)
class MessagesShape:
    name: str
    body: dict[str, Any]


WEATHER = {
    "name": "get_weather",
    "description": "Get the current weather in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
SEARCH = {
    "name": "search_code",
    "description": "Search the repository for a pattern.",
    "input_schema": {"properties": {"pattern": {"type": "string"}, "path": {"type": "string"}}},
}
TOOLS = [WEATHER, SEARCH]
SYSTEM_TEXT = "You are a careful coding assistant. Use the tools when they help."
BILLING = "x-anthropic-billing-header: cc_version=2.1.3; cc_entrypoint=cli; cch=4f2a9;"


def user(content: Any) -> dict[str, Any]:
    return {"role": "user", "content": content}


def assistant(content: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": content}


def text(t: str) -> dict[str, Any]:
    return {"type": "text", "text": t}


def tool_use(call_id: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"type": "tool_use", "id": call_id, "name": name, "input": args}


def tool_result(call_id: str, content: Any) -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": call_id, "content": content}


def thinking(t: str) -> dict[str, Any]:
    return {"type": "thinking", "thinking": t, "signature": "sig-abc"}


def agent_loop(rounds: int, *, with_thinking: bool = True, end_on_user: bool = False) -> list[dict[str, Any]]:
    """`rounds` of (assistant: thinking + a tool call, user: its result), after a question."""
    messages: list[dict[str, Any]] = [user("Find every call of parse_config and fix the bug.")]
    for i in range(rounds):
        blocks: list[dict[str, Any]] = [thinking(f"Round {i}: search module {i}.")] if with_thinking else []
        blocks.append(
            tool_use(f"toolu_{i:02d}", "search_code", {"pattern": f"parse_config_{i}", "path": "src/"})
        )
        messages.append(assistant(blocks))
        messages.append(
            user([tool_result(f"toolu_{i:02d}", f"src/module_{i}.py:{10 + i}: parse_config_{i}(path)")])
        )
    if end_on_user:
        messages.append(user("Now summarise what you found."))
    return messages


ASK = user("What's the weather in Paris?")
CALL = assistant([text("Let me check."), tool_use("toolu_01", "get_weather", {"city": "Paris"})])

SHAPES: list[MessagesShape] = [
    MessagesShape("plain_string", {"messages": [user("What is the capital of France?")]}),
    MessagesShape("single_text_block", {"messages": [user([text("What is the capital of France?")])]}),
    MessagesShape("two_text_blocks", {"messages": [user([text("First part."), text("Second part.")])]}),
    MessagesShape("system_string", {"system": SYSTEM_TEXT, "messages": [user("Hello")]}),
    MessagesShape(
        "system_blocks", {"system": [text("Part one. "), text("Part two.")], "messages": [user("Hi")]}
    ),
    MessagesShape(
        "system_billing_header", {"system": [text(BILLING), text(SYSTEM_TEXT)], "messages": [user("Hello")]}
    ),
    MessagesShape(
        "system_string_billing_header", {"system": BILLING + "\n" + SYSTEM_TEXT, "messages": [user("Hello")]}
    ),
    MessagesShape(
        "inline_system_message",
        {
            "system": SYSTEM_TEXT,
            "messages": [
                user("Hi"),
                assistant("Hello!"),
                {"role": "system", "content": "Reminder: be brief."},
                user("Go on"),
            ],
        },
    ),
    MessagesShape(
        "multi_turn",
        {"messages": [user("Hi"), assistant("Hello! How can I help?"), user("Say it in French.")]},
    ),
    MessagesShape("tools_declared", {"system": SYSTEM_TEXT, "tools": TOOLS, "messages": [ASK]}),
    MessagesShape(
        "tool_use_and_result",
        {"tools": TOOLS, "messages": [ASK, CALL, user([tool_result("toolu_01", "18 C and sunny")])]},
    ),
    MessagesShape(
        "tool_result_blocks",
        {
            "tools": TOOLS,
            "messages": [ASK, CALL, user([tool_result("toolu_01", [text("18 C"), text("sunny")])])],
        },
    ),
    MessagesShape(
        "tool_result_then_text",
        {
            "tools": TOOLS,
            "messages": [ASK, CALL, user([tool_result("toolu_01", "18 C"), text("And tomorrow?")])],
        },
    ),
    MessagesShape(
        "text_then_tool_result",
        {
            "tools": TOOLS,
            "messages": [ASK, CALL, user([text("Here it is:"), tool_result("toolu_01", "18 C")])],
        },
    ),
    MessagesShape(
        "parallel_tools",
        {
            "tools": TOOLS,
            "messages": [
                user("Weather in Paris and Tokyo?"),
                assistant(
                    [
                        tool_use("toolu_01", "get_weather", {"city": "Paris"}),
                        tool_use("toolu_02", "get_weather", {"city": "Tokyo"}),
                    ]
                ),
                user([tool_result("toolu_01", "18 C"), tool_result("toolu_02", "24 C")]),
            ],
        },
    ),
    MessagesShape(
        "thinking_and_tool_use",
        {
            "tools": TOOLS,
            "messages": [
                ASK,
                assistant(
                    [
                        thinking("I should call the tool."),
                        tool_use("toolu_01", "get_weather", {"city": "Paris"}),
                    ]
                ),
                user([tool_result("toolu_01", "18 C")]),
            ],
        },
    ),
    MessagesShape(
        "thinking_then_text",
        {
            "messages": [
                user("2+2?"),
                assistant([thinking("Simple arithmetic."), text("4")]),
                user("Times 3?"),
            ]
        },
    ),
    MessagesShape(
        "redacted_thinking",
        {
            "messages": [
                user("2+2?"),
                assistant([{"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix"}, text("4")]),
                user("Times 3?"),
            ]
        },
    ),
    MessagesShape("thinking_disabled", {"thinking": {"type": "disabled"}, "messages": [user("Hello")]}),
    MessagesShape(
        "thinking_enabled",
        {"thinking": {"type": "enabled", "budget_tokens": 2048}, "messages": [user("Hello")]},
    ),
    MessagesShape(
        "thinking_budget_too_small",
        {"thinking": {"type": "enabled", "budget_tokens": 100}, "messages": [user("Hello")]},
    ),
    MessagesShape("tool_choice_any", {"tools": TOOLS, "tool_choice": {"type": "any"}, "messages": [ASK]}),
    MessagesShape("tool_choice_none", {"tools": TOOLS, "tool_choice": {"type": "none"}, "messages": [ASK]}),
    MessagesShape(
        "tool_choice_named",
        {"tools": TOOLS, "tool_choice": {"type": "tool", "name": "get_weather"}, "messages": [ASK]},
    ),
    MessagesShape(
        "tool_choice_named_without_name", {"tools": TOOLS, "tool_choice": {"type": "tool"}, "messages": [ASK]}
    ),
    MessagesShape("empty_content_list", {"messages": [user("Hi"), assistant([]), user("Hello?")]}),
    MessagesShape("empty_string_content", {"messages": [user("")]}),
    MessagesShape(
        "image_block",
        {
            "messages": [
                user(
                    [
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": "image/png", "data": PNG_1PX},
                        },
                        text("What is this?"),
                    ]
                )
            ]
        },
    ),
    MessagesShape("unknown_block_type", {"messages": [user([{"type": "video", "url": "x"}])]}),
    MessagesShape("unknown_role", {"messages": [{"role": "tool", "content": "x"}]}),
    MessagesShape("agent_loop_5", {"system": SYSTEM_TEXT, "tools": TOOLS, "messages": agent_loop(5)}),
    MessagesShape(
        "agent_loop_20_no_thinking",
        {
            "system": [text(BILLING), text(SYSTEM_TEXT)],
            "tools": TOOLS,
            "messages": agent_loop(20, with_thinking=False),
        },
    ),
    MessagesShape(
        "agent_loop_8_then_user",
        {"system": SYSTEM_TEXT, "tools": TOOLS, "messages": agent_loop(8, end_on_user=True)},
    ),
]
