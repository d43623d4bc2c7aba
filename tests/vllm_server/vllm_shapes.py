"""The request shapes sent to the real vLLM server. Every answered shape must count exactly
(docs/compatibility/vllm.md); `refused` marks a request vLLM answers with a 400, which the proxy relays byte for
byte and does not analyse. Bodies carry only what shapes the prompt; tests add the model and limits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# The message and tool builders the llama-server shapes use; the same requests, another oracle.
from tests.interop.interop_shapes import WEATHER, user
from tests.interop.interop_shapes import text_parts as parts
from tests.interop.interop_shapes import tool_call as call
from tests.interop.interop_shapes import tool_result as tool

QWEN = "qwen2.5-instruct"


@dataclass(frozen=True)
class Shape:
    name: str
    endpoint: str  # chat | completions | embeddings | responses
    body: dict[str, Any]
    refused: bool = False  # vLLM answers 400


TIME = {
    "type": "function",
    "function": {"name": "get_time", "description": "The time in a zone.", "parameters": {"type": "object"}},
}
MINIMAL_TOOL = {"type": "function", "function": {"name": "ping"}}
ASK = user("What's the weather in Paris?")
LONG = " ".join(f"Sentence {i}: the quick brown fox jumps over the lazy dog." for i in range(230))


def assistant_calls(*calls: dict[str, Any], content: Any = None) -> dict[str, Any]:
    return {"role": "assistant", "content": content, "tool_calls": list(calls)}


def chat(name: str, messages: list[dict[str, Any]], **body: Any) -> Shape:
    return Shape(name, "chat", {"messages": messages, **body})


CHAT: list[Shape] = [
    chat("single_turn", [user("Name a colour.")]),
    chat("multi_turn", [user("Hi"), {"role": "assistant", "content": "Hello!"}, user("Tell me a joke.")]),
    chat("system", [{"role": "system", "content": "You are terse."}, user("Say hi.")]),
    chat("developer", [{"role": "developer", "content": "Answer in French."}, user("Say hi.")]),
    chat(
        "developer_after_system",
        [
            {"role": "system", "content": "Be kind."},
            {"role": "developer", "content": "Be brief."},
            user("Hi"),
        ],
    ),
    chat("unknown_role", [{"role": "narrator", "content": "Once upon a time."}, user("Go on.")]),
    chat("user_text_parts", [user(parts("First part.", "Second part."))]),
    chat("system_text_parts", [{"role": "system", "content": parts("Rule one.", "Rule two.")}, user("ok")]),
    chat(
        "assistant_text_parts",
        [user("Hi"), {"role": "assistant", "content": parts("Hello", "there.")}, user("And?")],
    ),
    chat("empty_user", [user("")]),
    chat("assistant_null_content", [user("Hi"), {"role": "assistant", "content": None}, user("Again")]),
    chat("empty_parts", [user([])]),
    chat("named_user", [{"role": "user", "content": "Hi", "name": "bob"}]),
    chat("unicode", [user("Café naïve 日本語 Ωμέγα 🚀👩‍👩‍👧 a\u00a0b \u200bzw Ame\u0301lie")]),
    chat("odd_whitespace", [user("  lead\t\ttabs\r\nCRLF\n\n\n  trailing   \n")]),
    chat("long_3k", [user(LONG)]),
    chat("tools_full", [ASK], tools=[WEATHER]),
    chat("tools_minimal", [user("ping")], tools=[MINIMAL_TOOL]),
    chat("tools_several", [ASK], tools=[WEATHER, TIME]),
    chat("tools_strict", [ASK], tools=[{**WEATHER, "function": {**WEATHER["function"], "strict": True}}]),
    chat("tool_choice_none", [ASK], tools=[WEATHER], tool_choice="none"),
    chat("tool_choice_auto", [ASK], tools=[WEATHER], tool_choice="auto"),
    chat("tool_choice_required", [ASK], tools=[WEATHER], tool_choice="required"),
    chat(
        "tool_choice_named",
        [ASK],
        tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    ),
    chat(
        "tool_round_trip_string_args",
        [ASK, assistant_calls(call("c1", '{"city": "Paris"}')), tool("c1", "sunny, 21C")],
        tools=[WEATHER],
    ),
    chat(
        "tool_round_trip_invalid_json_args",
        [ASK, assistant_calls(call("c1", "{not json")), tool("c1", "sunny")],
        tools=[WEATHER],
    ),
    chat(
        "tool_round_trip_non_object_args",
        [ASK, assistant_calls(call("c1", "[1, 2]")), tool("c1", "sunny")],
        tools=[WEATHER],
    ),
    chat(
        "several_tool_calls",
        [
            user("Weather in Paris and Rome?"),
            assistant_calls(call("c1", '{"city":"Paris"}'), call("c2", '{"city": "Rome"}'), content="Both."),
            tool("c1", "sunny"),
            tool("c2", "rain"),
            {"role": "assistant", "content": "Paris sunny, Rome rainy."},
            user("Thanks!"),
        ],
        tools=[WEATHER],
    ),
    chat(
        "tool_result_text_parts",
        [ASK, assistant_calls(call("c1", '{"city": "Paris"}')), tool("c1", parts("sunny", "21C"))],
        tools=[WEATHER],
    ),
    chat("empty_tool_calls", [user("Hi"), assistant_calls(content="Hello."), user("Bye")]),
    chat("template_kwargs_unused", [user("Hi")], chat_template_kwargs={"not_a_template_var": 1}),
    chat(
        "template_kwargs_repeat_flag",
        [user("Hi")],
        chat_template_kwargs={"add_generation_prompt": False},
    ),
    chat(
        "continue_final_message",
        [user("Write a haiku."), {"role": "assistant", "content": "Autumn"}],
        add_generation_prompt=False,
        continue_final_message=True,
    ),
    chat("generation_prompt_off", [user("Hi")], add_generation_prompt=False),
    chat("add_special_tokens", [user("Hi")], add_special_tokens=True),
    chat("documents", [user("Summarise.")], documents=[{"title": "A", "text": "Alpha beta."}]),
    chat("special_token_text", [user("<|im_start|>x<|im_end|> <|eot_id|>")]),
]

COMPLETIONS: list[Shape] = [
    Shape("prompt_string", "completions", {"prompt": "The sky is"}),
    Shape("prompt_list", "completions", {"prompt": ["The sky is", "Hello world, once again"]}),
    Shape("prompt_token_ids", "completions", {"prompt": [9707, 1879, 11, 374]}),
    Shape("prompt_no_special_tokens", "completions", {"prompt": "The sky is", "add_special_tokens": False}),
    Shape("prompt_unicode_whitespace", "completions", {"prompt": "Ünïcödé\t 日本\n\n  end "}),
]

RESPONSES: list[Shape] = [
    Shape("input_string", "responses", {"input": "Name a colour."}),
    Shape("input_with_instructions", "responses", {"input": "Name a colour.", "instructions": "Be terse."}),
    Shape(
        "input_items",
        "responses",
        {
            "input": [
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "Hello"}],
                },
                {"type": "message", "role": "user", "content": "More"},
            ]
        },
    ),
]

EMBEDDINGS: list[Shape] = [
    Shape("embed_string", "embeddings", {"input": "The sky is blue."}),
    Shape("embed_list", "embeddings", {"input": ["The sky is blue.", "Grass is green, mostly."]}),
]

REFUSED: list[Shape] = [
    # vLLM's request model refuses a null user content and tool-call arguments that are not a string.
    chat("user_null_content", [user(None)]),
    chat(
        "tool_call_object_arguments",
        [ASK, assistant_calls(call("c1", {"city": "Paris"})), tool("c1", "sunny")],
        tools=[WEATHER],
    ),
    Shape(
        "image_on_text_model",
        "chat",
        {
            "messages": [
                user(
                    [
                        {"type": "text", "text": "What is it?"},
                        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
                    ]
                )
            ]
        },
    ),
]
REFUSED = [Shape(s.name, s.endpoint, s.body, refused=True) for s in REFUSED]
ANSWERED = CHAT + COMPLETIONS + RESPONSES
# Answered shapes a family's own chat template refuses (vLLM answers 400, streamed or not): Llama 3.1's takes
# one tool call per assistant turn.
TEMPLATE_REFUSES: dict[str, frozenset[str]] = {"llama-3.1": frozenset({"several_tool_calls"})}
