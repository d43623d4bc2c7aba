"""core/flavors/llama_cpp.py: llama-server's request preparation on the modern families, offline.

The expected prompts are llama-server's own, from its `/apply-template` (llama.cpp 0.5.0-dev, commit 0c1e570,
serving the tiny GGUFs of scripts/build_tiny_gguf.sh); gpt-oss's date line is the server's clock, compared
as a pattern. tests/interop/test_llama_server_modern.py checks the counts live on 82 shapes.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from proxy.core.count import INVALID_BODY, SERVER_REFUSES
from proxy.core.encoders import ReferenceEncoder
from proxy.core.extract import chat_input
from proxy.core.flavors import flavor_named
from proxy.core.flavors.llama_cpp import (
    FAILS,
    REFUSES,
    LlamaCppEncoder,
    llama_cpp_chat_body,
    patched_template,
)
from proxy.core.messages import InvalidBody, ServerRefuses
from tests.conftest import load_shared, served_by_llama_cpp

THOUGHT = "Think first."
USER = {"role": "user", "content": "Hi"}
TOOL = {
    "type": "function",
    "function": {"name": "f", "parameters": {"type": "object", "properties": {"x": {"type": "number"}}}},
}
TOOL_TURN = {
    "messages": [
        USER,
        {
            "role": "assistant",
            "content": "Checking.",
            "reasoning_content": THOUGHT,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"x":1.50}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
    ],
    "tools": [TOOL],
}
PREFILL = {"messages": [USER, {"role": "assistant", "content": "Hel"}]}
PREFILL_REASONING = {"messages": [USER, {"role": "assistant", "content": "", "reasoning_content": THOUGHT}]}

GPT_OSS_SYSTEM = (
    "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
    "Knowledge cutoff: 2024-06\nCurrent date: DATE\n\nReasoning: medium\n\n"
    "# Valid channels: analysis, commentary, final. Channel must be included for every message."
)
SERVER_PROMPTS = {
    ("qwen3", "prefill"): "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nHel",
    (
        "qwen3",
        "prefill_reasoning",
    ): "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\nThink first.",
    ("qwen3", "tool_turn"): (
        "<|im_start|>system\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
        '{"type": "function", "function": {"name": "f", "description": "", "parameters": {"type": "object", '
        '"properties": {"x": {"type": "number"}}}}}\n</tools>\n\nFor each function call, return a json object '
        "with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\nThink first.\n</think>\n\nChecking.\n"
        '<tool_call>\n{"name": "f", "arguments": {"x": 1.5}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\nok\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    ),
    ("gpt-oss", "prefill"): GPT_OSS_SYSTEM
    + "<|end|><|start|>user<|message|>Hi<|end|><|start|>assistant<|channel|>analysis<|message|><|end|>"
    "<|start|>assistant<|channel|>final<|message|>Hel",
    ("gpt-oss", "prefill_reasoning"): GPT_OSS_SYSTEM
    + "<|end|><|start|>user<|message|>Hi<|end|><|start|>assistant<|channel|>analysis<|message|>Think first.",
    ("gpt-oss", "tool_turn"): GPT_OSS_SYSTEM
    + "\nCalls to these tools must go to the commentary channel: 'functions'.<|end|>"
    "<|start|>developer<|message|># Tools\n\n## functions\n\nnamespace functions {\n\n// \n"
    "type f = (_: {\nx?: number,\n}) => any;\n\n} // namespace functions<|end|>"
    "<|start|>user<|message|>Hi<|end|><|start|>assistant<|channel|>analysis<|message|>Think first.<|end|>"
    "<|start|>assistant to=functions.f<|channel|>commentary json<|message|>"
    '{"x": 1.5}<|call|><|start|>functions.f to=assistant<|channel|>commentary<|message|>"ok"<|end|>'
    "<|start|>assistant",
}
BODIES = {"prefill": PREFILL, "prefill_reasoning": PREFILL_REASONING, "tool_turn": TOOL_TURN}


def served(family: str) -> Any:
    """The tokenizer as the llama.cpp flavor serves it (a copy: made once per family and session)."""
    return served_by_llama_cpp(family)


def rendered(family: str, body: dict[str, Any]) -> str:
    tok = served(family)
    enc = LlamaCppEncoder(ReferenceEncoder(tok))
    prepared = llama_cpp_chat_body(body, enc.template)
    chat = chat_input(prepared, enc.parts_format, enc.developer_role, refusals=False)
    return enc.render(chat)


@pytest.mark.parametrize(("family", "name"), sorted(SERVER_PROMPTS))
def test_prompt_is_llama_servers(family: str, name: str) -> None:
    text = re.sub(r"Current date: \d{4}-\d{2}-\d{2}", "Current date: DATE", rendered(family, BODIES[name]))
    assert text == SERVER_PROMPTS[(family, name)]


def test_reasoning_continued_on_a_template_without_reasoning_is_the_generation_prompt() -> None:
    """generate_parser: no reasoning opener found, so the generation prompt alone (the reasoning dropped)."""
    assert rendered("qwen2.5-instruct", PREFILL_REASONING).endswith("<|im_start|>assistant\n")


def test_messages_rebuilt_from_the_fields_llama_cpp_reads() -> None:
    body = {
        "messages": [
            {"role": "developer", "content": [{"type": "text", "text": ""}, {"type": "text", "text": "x"}]},
            {"role": "user", "content": None, "name": ""},
            {
                "role": "assistant",
                "content": "a",
                "reasoning": "vllm's name",
                "thinking": "t",
                "tool_calls": [],
            },
            {"role": "user", "content": "u"},
        ]
    }
    out = llama_cpp_chat_body(body)["messages"]
    assert out == [
        {"role": "system", "content": "x"},  # developer -> system; no "\n" before the first text
        {"role": "user", "content": ""},
        {"role": "assistant", "content": "a"},
        {"role": "user", "content": "u"},
    ]
    gpt_oss = served("gpt-oss").chat_template
    assert llama_cpp_chat_body(body, gpt_oss)["messages"][0]["role"] == "developer"
    # gpt-oss.cpp: the reasoning of a tool-call turn is its analysis; the content goes.
    assert llama_cpp_chat_body(TOOL_TURN, gpt_oss)["messages"][1]["content"] == ""
    assert llama_cpp_chat_body(TOOL_TURN)["messages"][1]["content"] == "Checking."


def test_reasoning_effort() -> None:
    kwargs = llama_cpp_chat_body({"messages": [USER], "reasoning_effort": "none"})["chat_template_kwargs"]
    assert kwargs == {"enable_thinking": False}
    body = {
        "messages": [USER],
        "reasoning_effort": "low",
        "chat_template_kwargs": {"reasoning_effort": "high"},
    }
    out = llama_cpp_chat_body(body)
    assert out["chat_template_kwargs"] == {"reasoning_effort": "low"} and "reasoning_effort" not in out


@pytest.mark.parametrize(
    "body",
    [
        {"messages": [USER, {"role": "assistant", "content": "a"}, {"role": "assistant", "content": "b"}]},
        {"messages": [{"role": "user"}]},
        {"messages": [USER, {"role": "assistant"}]},
        {**PREFILL, "continue_final_message": True},
        {"messages": TOOL_TURN["messages"][:2]},
        {"messages": [USER], "chat_template_kwargs": {"enable_thinking": "false"}},
    ],
)
def test_refusals(body: dict[str, Any]) -> None:
    with pytest.raises(ServerRefuses, match=f"^{re.escape(REFUSES)}"):
        llama_cpp_chat_body(body)
    tok = served("qwen3")
    assert (
        flavor_named("llama.cpp").count(ReferenceEncoder(tok), "chat", body, False).fallback_reason
        == SERVER_REFUSES
    )


def test_arguments_that_are_not_json() -> None:
    """func_args_not_string: a 500 for a template that reads arguments as objects, none for one that
    writes no tool calls (Llama-3-Instruct)."""
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "not json"}}
    turn, result = {**TOOL_TURN["messages"][1], "tool_calls": [call]}, TOOL_TURN["messages"][2]
    body = {**TOOL_TURN, "messages": [USER, turn, result]}
    with pytest.raises(InvalidBody, match=f"^{re.escape(FAILS)}"):
        llama_cpp_chat_body(body, served("qwen3").chat_template)
    assert flavor_named("llama.cpp").count(
        ReferenceEncoder(served("qwen3")), "chat", body, False
    ).fallback_reason == (INVALID_BODY)
    llama3 = load_shared("llama-3-8b-instruct").tokenizer.chat_template
    assert (
        llama_cpp_chat_body(body, llama3)["messages"][1]["tool_calls"][0]["function"]["arguments"]
        == "not json"
    )


def test_gpt_oss_template_patched_as_llama_server_keeps_it() -> None:
    original = load_shared("gpt-oss").tokenizer.chat_template
    patched = served("gpt-oss").chat_template
    assert patched == patched_template(original) != original
    assert patched.count("{%- if false %}") == 1
    assert (
        patched_template(load_shared("qwen3").tokenizer.chat_template)
        == load_shared("qwen3").tokenizer.chat_template
    )
    body = {"messages": [USER, {"role": "assistant", "content": "see <|channel|>final<|message|>"}, USER]}
    assert "see <|channel|>final<|message|>" in rendered("gpt-oss", body)
