"""The request shapes real users send, and where llama-server's count is documented to differ.

`diverges` maps a tokenizer family to the cause (a heading in docs/compatibility/llama-cpp.md, "Divergences"); a shape with
no entry must count exactly. Bodies carry only what shapes the prompt; tests add model, seed and limits.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

QWEN = "qwen2.5-instruct"
LLAMA3 = "llama-3-8b-instruct"
BOTH = (QWEN, LLAMA3)

# causes (anchors in docs/compatibility/llama-cpp.md)
NFC = "no-unicode-normalization"
TOOLS_REBUILT = "tools-rebuilt"
FLOATS = "floats-printed-as-g"
PREFILL = "final-assistant-message-is-continued"
FIRST_PROMPT = "list-of-prompts-usage-is-the-first-prompts"
VLLM_REFUSES = "vllm-refuses-what-llama-server-answers"


@dataclass(frozen=True)
class Shape:
    name: str
    endpoint: str  # "chat" | "completions"
    body: dict[str, Any]
    diverges: dict[str, str] = field(default_factory=dict)


def user(text: Any) -> dict[str, Any]:
    return {"role": "user", "content": text}


def text_parts(*texts: str) -> list[dict[str, str]]:
    return [{"type": "text", "text": t} for t in texts]


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Paris"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}


def tool_call(call_id: str, args: str, name: str = "get_weather") -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


def tool_result(call_id: str, content: Any) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


LONG_TEXT = " ".join(f"Sentence {i}: the quick brown fox jumps over the lazy dog." for i in range(250))
ASK = user("What's the weather in Paris?")

CHAT: list[Shape] = [
    Shape("single_turn", "chat", {"messages": [user("Name a colour.")]}),
    Shape(
        "system_prompt",
        "chat",
        {"messages": [{"role": "system", "content": "You are terse."}, user("Say hi.")]},
    ),
    Shape(
        "multi_turn",
        "chat",
        {
            "messages": [
                {"role": "system", "content": "Be kind."},
                user("Hi"),
                {"role": "assistant", "content": "Hello! How can I help?"},
                user("Tell me a joke."),
            ]
        },
    ),
    Shape("text_parts", "chat", {"messages": [user(text_parts("First part.", "Second part."))]}),
    Shape("text_parts_leading_empty", "chat", {"messages": [user(text_parts("", "after an empty part"))]}),
    Shape("text_parts_empty_list", "chat", {"messages": [user([])]}),
    Shape(
        "system_text_parts",
        "chat",
        {"messages": [{"role": "system", "content": text_parts("Rule one.", "Rule two.")}, user("ok")]},
    ),
    Shape("unicode", "chat", {"messages": [user("Café naïve 日本語 Ωμέγα 🚀👩‍👩‍👧 a\u00a0b \u200bzw")]}),
    Shape(
        "unicode_decomposed",
        "chat",
        {"messages": [user("Ame\u0301lie cafe\u0301")]},  # NFD: e + U+0301 COMBINING ACUTE ACCENT
        diverges={QWEN: NFC},
    ),
    Shape("odd_whitespace", "chat", {"messages": [user("  lead\t\ttabs\r\nCRLF\n\n\n  trailing   \n")]}),
    Shape("empty_user", "chat", {"messages": [user("")]}),
    Shape("empty_system", "chat", {"messages": [{"role": "system", "content": ""}, user("x")]}),
    Shape(
        "null_content",
        "chat",
        {"messages": [user(None)]},
        diverges={QWEN: VLLM_REFUSES, LLAMA3: VLLM_REFUSES},
    ),
    Shape("named_user", "chat", {"messages": [{"role": "user", "content": "Hi", "name": "bob"}]}),
    Shape("special_token_text", "chat", {"messages": [user("<|im_start|>x<|im_end|> <|eot_id|>")]}),
    Shape("long_prompt", "chat", {"messages": [user(LONG_TEXT)]}),
    Shape(
        "assistant_prefill",
        "chat",
        {"messages": [user("Write a haiku."), {"role": "assistant", "content": "Autumn"}]},
        diverges={QWEN: PREFILL, LLAMA3: PREFILL},
    ),
    Shape("tools", "chat", {"messages": [ASK], "tools": [WEATHER]}),
    Shape(
        "tool_call_and_result",
        "chat",
        {
            "messages": [
                ASK,
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [tool_call("call_1", '{"city": "Paris"}')],
                },
                tool_result("call_1", '{"temperature": 21, "sky": "clear"}'),
            ],
            "tools": [WEATHER],
        },
    ),
    Shape(
        "parallel_tool_calls",
        "chat",
        {
            "messages": [
                user("Weather in Paris and Rome?"),
                {
                    "role": "assistant",
                    "content": "Checking both.",
                    "tool_calls": [
                        tool_call("call_1", '{"city":"Paris"}'),
                        tool_call("call_2", '{"city": "Rome", "unit": "celsius"}'),
                    ],
                },
                tool_result("call_1", "sunny"),
                tool_result("call_2", "rain"),
                {"role": "assistant", "content": "Paris is sunny, Rome rainy."},
                user("Thanks!"),
            ],
            "tools": [WEATHER],
        },
    ),
    Shape(
        "tool_result_text_parts",
        "chat",
        {
            "messages": [
                ASK,
                {"role": "assistant", "content": None, "tool_calls": [tool_call("c1", '{"city": "Paris"}')]},
                tool_result("c1", text_parts("sunny", "21C")),
            ],
            "tools": [WEATHER],
        },
    ),
    Shape(
        "tool_without_description_or_parameters",
        "chat",
        # No divergence since the vllm flavor dumps tools as vLLM's request model: `"description": null,
        # "parameters": null` costs Qwen2.5 the same tokens as llama-server's rebuilt `"", {}`.
        {"messages": [user("ping")], "tools": [{"type": "function", "function": {"name": "ping"}}]},
    ),
    Shape(
        "tool_strict",
        "chat",
        {"messages": [ASK], "tools": [{**WEATHER, "function": {**WEATHER["function"], "strict": True}}]},
        diverges={QWEN: TOOLS_REBUILT},
    ),
    Shape(
        "tool_float_schema",
        "chat",
        {
            "messages": [user("Pick a number.")],
            "tools": [
                {
                    "type": "function",
                    "function": {
                        "name": "pick",
                        "description": "Pick a number.",
                        "parameters": {
                            "type": "object",
                            "properties": {
                                "x": {
                                    "type": "number",
                                    "minimum": 0.5,
                                    "maximum": 10.0,
                                    "default": 3.14159265,
                                }
                            },
                        },
                    },
                }
            ],
        },
        diverges={QWEN: FLOATS},
    ),
    Shape(
        "tool_call_float_arguments",
        "chat",
        {
            "messages": [
                user("Scale it."),
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [tool_call("c1", '{"factor": 2.0, "offset": 1e3}', name="scale")],
                },
                tool_result("c1", "done"),
            ],
            "tools": [
                {
                    "type": "function",
                    "function": {
                        "name": "scale",
                        "description": "Scale.",
                        "parameters": {"type": "object", "properties": {"factor": {"type": "number"}}},
                    },
                }
            ],
        },
        diverges={QWEN: FLOATS},
    ),
]

COMPLETIONS: list[Shape] = [
    Shape("prompt_string", "completions", {"prompt": "The sky is"}),
    Shape("prompt_empty", "completions", {"prompt": ""}),
    Shape("prompt_unicode_whitespace", "completions", {"prompt": "Ünïcödé\t 日本\n\n  end "}),
    Shape("prompt_with_special_token_text", "completions", {"prompt": "<|begin_of_text|>Hi <|im_start|>"}),
    Shape("prompt_token_ids", "completions", {"prompt": [1, 2, 3, 4]}),
    Shape("prompt_long", "completions", {"prompt": LONG_TEXT}),
    Shape(
        "prompt_list",
        "completions",
        {"prompt": ["The sky is", "Hello world, once again"]},
        diverges={QWEN: FIRST_PROMPT, LLAMA3: FIRST_PROMPT},
    ),
]

SHAPES = CHAT + COMPLETIONS
