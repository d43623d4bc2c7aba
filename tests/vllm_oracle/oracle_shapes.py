"""The request shapes put to vLLM 0.32's own preprocessing (tests/vllm_oracle): the real-server shapes of
tests/vllm_server/vllm_shapes.py, and the shapes of agent traffic: assistant turns with reasoning and tool
calls together, parallel calls, long tool loops, reasoning effort, thinking switched off, `/v1/responses`
items. Which of them vLLM refuses is the oracle's answer, not a flag here. Bodies carry only what shapes the
prompt; tests add the model and limits.
"""

from __future__ import annotations

import json
from typing import Any

from tests.vllm_server.vllm_shapes import ANSWERED, REFUSED, TIME, WEATHER, Shape, assistant_calls, chat, user
from tests.vllm_server.vllm_shapes import call as tool_call
from tests.vllm_server.vllm_shapes import tool as tool_result

SEARCH = {
    "type": "function",
    "function": {
        "name": "search_code",
        "description": "Search the repository for a pattern.",
        "parameters": {
            "type": "object",
            "properties": {"pattern": {"type": "string"}, "path": {"type": "string"}},
            "required": ["pattern"],
        },
    },
}
AGENT_TOOLS = [WEATHER, TIME, SEARCH]
SYSTEM = {"role": "system", "content": "You are a careful assistant. Use the tools when they help."}
ASK = user("What's the weather in Paris and the time in Tokyo?")
THOUGHT = "The user wants two facts. I should call the tools rather than guess."


def weather_call(call_id: str, city: str) -> dict[str, Any]:
    return tool_call(call_id, json.dumps({"city": city}))


def thinking(
    reasoning: str, *calls: dict[str, Any], content: Any = None, key: str = "reasoning"
) -> dict[str, Any]:
    """An assistant turn as an agent client sends it back: its reasoning, and its tool calls if any."""
    msg: dict[str, Any] = {"role": "assistant", "content": content, key: reasoning}
    if calls:
        msg["tool_calls"] = list(calls)
    return msg


def agent_loop(rounds: int, *, end_on_user: bool, reasoning: bool = True) -> list[dict[str, Any]]:
    """`rounds` of (assistant reasoning + a tool call, the tool's result), after a system prompt and a
    question; ending on the last tool result (the request that asks for the next step) or a new user turn."""
    messages: list[dict[str, Any]] = [SYSTEM, user("Find every call of parse_config and check the weather.")]
    for i in range(rounds):
        call = tool_call(
            f"call_{i}", json.dumps({"pattern": f"parse_config_{i}", "path": "src/"}), "search_code"
        )
        thought = f"Round {i}: search the next module for parse_config_{i}."
        messages.append(thinking(thought, call) if reasoning else assistant_calls(call))
        messages.append(tool_result(f"call_{i}", f"src/module_{i}.py:{10 + i}: parse_config_{i}(path)"))
    if end_on_user:
        messages.append(
            {"role": "assistant", "content": "I found every call.", "reasoning": "Done searching."}
        )
        messages.append(user("Now summarise what you found."))
    return messages


AGENT: list[Shape] = [
    # An empty tool list reaches the template as [] (not None): a template that tests `tools is not none`
    # (Llama 3.1's) writes its tool preamble for it.
    Shape("tools_empty_list", "chat", {"messages": [ASK], "tools": []}),
    chat(
        "reasoning_content_turn",
        [
            user("Capital of France?"),
            thinking(THOUGHT, content="Paris.", key="reasoning_content"),
            user("And Italy?"),
        ],
    ),
    chat(
        "reasoning_turn",
        [user("Capital of France?"), thinking(THOUGHT, content="Paris."), user("And Italy?")],
    ),
    chat(
        "reasoning_and_reasoning_content",
        [
            user("Capital of France?"),
            {
                "role": "assistant",
                "content": "Paris.",
                "reasoning": "short",
                "reasoning_content": "a longer one",
            },
            user("And Italy?"),
        ],
    ),
    chat("reasoning_on_last_assistant", [user("Capital of France?"), thinking(THOUGHT, content="Paris.")]),
    chat(
        "agent_turn_reasoning_content_tool_calls",
        [
            SYSTEM,
            ASK,
            thinking(THOUGHT, weather_call("c1", "Paris"), key="reasoning_content"),
            tool_result("c1", "sunny"),
        ],
        tools=AGENT_TOOLS,
    ),
    chat(
        "agent_turn_reasoning_tool_calls",
        [SYSTEM, ASK, thinking(THOUGHT, weather_call("c1", "Paris")), tool_result("c1", "sunny")],
        tools=AGENT_TOOLS,
    ),
    chat(
        "agent_turn_content_reasoning_tool_calls",
        [
            SYSTEM,
            ASK,
            thinking(THOUGHT, weather_call("c1", "Paris"), content="Let me check."),
            tool_result("c1", "sunny"),
        ],
        tools=AGENT_TOOLS,
    ),
    chat(
        "agent_turn_empty_content_tool_calls",
        [SYSTEM, ASK, thinking(THOUGHT, weather_call("c1", "Paris"), content=""), tool_result("c1", "sunny")],
        tools=AGENT_TOOLS,
    ),
    chat(
        "parallel_tool_calls",
        [
            SYSTEM,
            ASK,
            thinking(
                THOUGHT, weather_call("c1", "Paris"), tool_call("c2", '{"zone": "Asia/Tokyo"}', "get_time")
            ),
            tool_result("c1", "sunny, 21C"),
            tool_result("c2", "14:05"),
        ],
        tools=AGENT_TOOLS,
    ),
    chat(
        "parallel_tool_calls_then_user",
        [
            SYSTEM,
            ASK,
            thinking(
                THOUGHT, weather_call("c1", "Paris"), tool_call("c2", '{"zone": "Asia/Tokyo"}', "get_time")
            ),
            tool_result("c1", "sunny, 21C"),
            tool_result("c2", "14:05"),
            thinking("Both answers are in.", content="Paris is sunny; it is 14:05 in Tokyo."),
            user("Thanks. And Rome?"),
        ],
        tools=AGENT_TOOLS,
    ),
    chat(
        "tool_calls_without_reasoning_parallel",
        [
            ASK,
            assistant_calls(
                weather_call("c1", "Paris"), tool_call("c2", '{"zone": "Asia/Tokyo"}', "get_time")
            ),
            tool_result("c1", "sunny"),
            tool_result("c2", "14:05"),
        ],
        tools=AGENT_TOOLS,
    ),
    chat("agent_5_rounds_end_tool", agent_loop(5, end_on_user=False), tools=AGENT_TOOLS),
    chat("agent_5_rounds_end_user", agent_loop(5, end_on_user=True), tools=AGENT_TOOLS),
    chat("agent_20_rounds_end_tool", agent_loop(20, end_on_user=False), tools=AGENT_TOOLS),
    chat("agent_20_rounds_end_user", agent_loop(20, end_on_user=True), tools=AGENT_TOOLS),
    chat("agent_5_rounds_no_reasoning", agent_loop(5, end_on_user=False, reasoning=False), tools=AGENT_TOOLS),
    chat("system_with_period", [{"role": "system", "content": "You are a helpful assistant."}, user("Hi")]),
    chat("system_without_period", [{"role": "system", "content": "You are a helpful assistant"}, user("Hi")]),
    chat(
        "system_with_period_and_tools",
        [{"role": "system", "content": "You are a helpful assistant."}, ASK],
        tools=[WEATHER],
    ),
    *[
        chat(f"reasoning_effort_{e}", [SYSTEM, user("Hi")], reasoning_effort=e)
        for e in ("low", "medium", "high")
    ],
    chat("reasoning_effort_none", [SYSTEM, user("Hi")], reasoning_effort="none"),
    chat("reasoning_effort_minimal", [SYSTEM, user("Hi")], reasoning_effort="minimal"),
    chat("reasoning_effort_extreme", [SYSTEM, user("Hi")], reasoning_effort="extreme"),
    chat(
        "reasoning_effort_with_tools",
        [SYSTEM, ASK, thinking(THOUGHT, weather_call("c1", "Paris")), tool_result("c1", "sunny")],
        tools=AGENT_TOOLS,
        reasoning_effort="high",
    ),
    chat("enable_thinking_false", [user("Hi")], chat_template_kwargs={"enable_thinking": False}),
    chat("enable_thinking_true", [user("Hi")], chat_template_kwargs={"enable_thinking": True}),
    chat(
        "enable_thinking_false_with_history",
        [user("Capital of France?"), thinking(THOUGHT, content="Paris."), user("And Italy?")],
        chat_template_kwargs={"enable_thinking": False},
    ),
    chat(
        "enable_thinking_false_reasoning_effort_high",
        [user("Hi")],
        reasoning_effort="high",
        chat_template_kwargs={"enable_thinking": False},
    ),
    chat(
        "developer_with_tools",
        [{"role": "developer", "content": "Answer in French."}, ASK],
        tools=AGENT_TOOLS,
    ),
    chat(
        "developer_and_system",
        [SYSTEM, {"role": "developer", "content": "Answer in French."}, ASK],
        tools=[WEATHER],
        reasoning_effort="low",
    ),
    chat("tool_choice_required_agent", [SYSTEM, ASK], tools=AGENT_TOOLS, tool_choice="required"),
    # truncate_prompt_tokens (vllm/renderers/params.py): the prompt cut to N tokens, from either side
    chat("truncate_prompt_tokens_8", [SYSTEM, ASK], truncate_prompt_tokens=8),
    chat("truncate_prompt_tokens_8_left", [SYSTEM, ASK], truncate_prompt_tokens=8, truncation_side="left"),
    chat("truncate_prompt_tokens_above_the_prompt", [SYSTEM, ASK], truncate_prompt_tokens=2000),
    chat("truncate_prompt_tokens_context", [SYSTEM, ASK], truncate_prompt_tokens=-1),
    # fields of the request model that take no null (pydantic's 400), and one that does
    chat("null_ignore_eos", [ASK], ignore_eos=None),
    chat("null_echo_and_min_tokens", [ASK], echo=None, min_tokens=None),
    chat("null_add_special_tokens", [ASK], add_special_tokens=None),
    chat("null_reasoning_effort", [ASK], reasoning_effort=None),
    Shape(
        "completions_truncate_prompt_tokens_3",
        "completions",
        {"prompt": ["The sky is blue today", "Hi"], "truncate_prompt_tokens": 3},
    ),
]


def item_user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def item_reasoning(text: str, n: int = 0) -> dict[str, Any]:
    return {
        "type": "reasoning",
        "id": f"rs_{n}",
        "summary": [],
        "content": [{"type": "reasoning_text", "text": text}],
    }


def item_call(call_id: str, args: str, name: str = "get_weather") -> dict[str, Any]:
    return {"type": "function_call", "call_id": call_id, "name": name, "arguments": args}


def item_output(call_id: str, output: str) -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": output}


def item_answer(text: str, n: int = 0) -> dict[str, Any]:
    return {
        "type": "message",
        "role": "assistant",
        "id": f"msg_{n}",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


# Responses tools are flat: {"type": "function", "name", "description", "parameters"}.
RESPONSES_TOOLS = [{"type": "function", **tool["function"]} for tool in AGENT_TOOLS]


def responses(name: str, body: dict[str, Any]) -> Shape:
    return Shape(name, "responses", body)


RESPONSES_AGENT: list[Shape] = [
    responses(
        "responses_function_call_round_trip",
        {
            "input": [
                item_user("Weather in Paris?"),
                item_call("c1", '{"city": "Paris"}'),
                item_output("c1", "sunny"),
            ],
            "tools": RESPONSES_TOOLS,
        },
    ),
    responses(
        "responses_reasoning_function_call",
        {
            "instructions": "Use the tools.",
            "input": [
                item_user("Weather in Paris?"),
                item_reasoning(THOUGHT),
                item_call("c1", '{"city": "Paris"}'),
                item_output("c1", "sunny"),
            ],
            "tools": RESPONSES_TOOLS,
        },
    ),
    responses(
        "responses_reasoning_parallel_calls_then_user",
        {
            "input": [
                item_user("Weather in Paris and time in Tokyo?"),
                item_reasoning(THOUGHT),
                item_call("c1", '{"city": "Paris"}'),
                item_call("c2", '{"zone": "Asia/Tokyo"}', "get_time"),
                item_output("c1", "sunny"),
                item_output("c2", "14:05"),
                item_reasoning("Both are in.", 1),
                item_answer("Sunny in Paris; 14:05 in Tokyo."),
                item_user("Thanks. And Rome?"),
            ],
            "tools": RESPONSES_TOOLS,
        },
    ),
    responses(
        "responses_3_rounds",
        {
            "instructions": "You are a careful assistant.",
            "input": [
                item_user("Find parse_config."),
                *[
                    item
                    for i in range(3)
                    for item in (
                        item_reasoning(f"Round {i}.", i),
                        item_call(f"c{i}", json.dumps({"pattern": f"parse_config_{i}"}), "search_code"),
                        item_output(f"c{i}", f"src/m{i}.py:{i}"),
                    )
                ],
            ],
            "tools": RESPONSES_TOOLS,
        },
    ),
    responses("responses_reasoning_effort_low", {"input": "Hi", "reasoning": {"effort": "low"}}),
    responses("responses_reasoning_effort_high", {"input": "Hi", "reasoning": {"effort": "high"}}),
    responses(
        "responses_developer_item",
        {
            "input": [
                {"type": "message", "role": "developer", "content": "Answer in French."},
                item_user("Say hi."),
            ]
        },
    ),
    responses(
        "responses_system_item",
        {"input": [{"type": "message", "role": "system", "content": "Be terse."}, item_user("Say hi.")]},
    ),
    responses("responses_tools_only", {"input": "Weather in Paris?", "tools": RESPONSES_TOOLS}),
]

SHAPES: list[Shape] = [*ANSWERED, *REFUSED, *AGENT, *RESPONSES_AGENT]
