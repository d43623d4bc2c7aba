"""`server_flavor: llama.cpp`: llama-server's request preparation, modelled (checked live in tests/interop)."""

from __future__ import annotations

import json

from proxy.core.count import count_request
from proxy.core.flavors import flavor_named
from proxy.core.flavors.llama_cpp import cpp_number, llama_cpp_chat_body, reported_prompt_tokens
from proxy.core.usage import SSEUsageParser
from tests.builders import build_tokenizer
from tests.conftest import load_shared, served_by_llama_cpp

PREFILL = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hel"}]}


def test_final_assistant_message_is_continued() -> None:
    tok = build_tokenizer("chatml")
    vllm = count_request(tok, "chat", PREFILL).templated
    cpp = count_request(tok, "chat", llama_cpp_chat_body(PREFILL)).templated
    closed_and_opened = len(tok("<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)["input_ids"])
    assert vllm - cpp == closed_and_opened
    # oaicompat_chat_params_parse: an explicit false is no continuation, and --prefill-assistant then
    # continues the final assistant message anyway (checked live in tests/interop).
    explicit = {**PREFILL, "continue_final_message": False}
    assert llama_cpp_chat_body(explicit)["continue_final_message"] is True


def test_tools_rebuilt_and_floats_as_printf_g() -> None:
    body = {
        "messages": [
            {"role": "user", "content": "x"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1.0}'}}
                ],
            },
            {"role": "tool", "tool_call_id": "1", "content": "ok"},
        ],
        "tools": [
            {"type": "function", "function": {"name": "f", "strict": True, "parameters": {"x": 3.14159265}}}
        ],
    }
    out = llama_cpp_chat_body(body)
    assert out["tools"] == [
        {"type": "function", "function": {"name": "f", "description": "", "parameters": {"x": 3.14159}}}
    ]
    assert json.loads(out["messages"][1]["tool_calls"][0]["function"]["arguments"]) == {"a": 1}
    assert body["tools"][0]["function"]["strict"] is True  # the wire body is not mutated
    assert (cpp_number(1.0), cpp_number(10.5), cpp_number(3.14159265)) == (1, 10.5, 3.14159)


def test_no_unicode_normalization_on_qwen() -> None:
    tok = load_shared("qwen2.5-instruct").tokenizer
    cpp = served_by_llama_cpp(
        "qwen2.5-instruct"
    )  # flavor_named("llama.cpp").served_tokenizer(tok), made once
    decomposed = "Ame\u0301lie cafe\u0301"
    assert len(cpp(decomposed)["input_ids"]) > len(tok(decomposed)["input_ids"])
    assert cpp("plain ascii")["input_ids"] == tok("plain ascii")["input_ids"]
    assert flavor_named("vllm").served_tokenizer(tok) is tok


def test_sentencepiece_normalizer_is_kept() -> None:
    tok = load_shared("mistral-7b-instruct-v0.1").tokenizer
    cpp = flavor_named("llama.cpp").served_tokenizer(tok)
    text = "Hello  world, café"
    assert cpp(text)["input_ids"] == tok(text)["input_ids"]


def test_nonstreamed_prompt_list_reports_first_prompt() -> None:
    assert reported_prompt_tokens("completions", (3, 5), streamed=False) == 3
    assert reported_prompt_tokens("completions", (3, 5), streamed=True) is None
    assert reported_prompt_tokens("completions", (3,), streamed=False) is None


def _event(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def test_stream_of_several_prompts_sums_finish_chunk_usage() -> None:
    """llama.cpp: each prompt's usage on its own finish chunk, a `data: null` between prompts, no total."""
    stream = b"".join(
        [
            _event({"choices": [{"index": 0, "text": "a", "finish_reason": None}]}),
            _event({"choices": [{"index": 0, "text": "", "finish_reason": "length"}],
                    "usage": {"prompt_tokens": 3, "completion_tokens": 2}}),
            b"data: null\n\n",
            _event({"choices": [{"index": 1, "text": "", "finish_reason": "length"}],
                    "usage": {"prompt_tokens": 5, "completion_tokens": 2}}),
            b"data: [DONE]\n\n",
        ]
    )  # fmt: skip
    parser = SSEUsageParser()
    for i in range(len(stream)):
        parser.feed(stream[i : i + 1])
    usage = parser.result()
    assert usage is not None and (usage.input_tokens, usage.output_tokens) == (8, 4)
    # An OpenAI/vLLM total chunk wins over per-choice sums.
    total = stream.replace(b"data: [DONE]", _event({"choices": [], "usage": {"prompt_tokens": 8}})[:-2])
    parser = SSEUsageParser()
    parser.feed(total)
    assert parser.result().input_tokens == 8
