"""The rest of usage: output, cached-prompt and reasoning tokens, parsed by the one usage parser
(proxy/core/usage.py) from real servers' bytes, fed whole and one byte at a time, on chat, completions and
/v1/responses; a missing or null field stays None (never 0), and a value that is not a count is no count."""

from __future__ import annotations

import orjson
import pytest

from proxy.core.buffers import JSONUsageWindow
from proxy.core.usage import SSEUsageParser, Usage, usage_from_json_bytes, usage_of
from tests.server.helpers import load_recorded, recorded_fixtures

# Captured from vLLM 0.32 (CPU build, the tiny Qwen2.5 model, --enable-prompt-tokens-details), the model path
# shortened to "qwen". The chat stream is a second identical request: 128 of its 174 prompt tokens (one
# 128-token block) came from the prefix cache. vLLM sends no completion_tokens_details without a reasoning
# parser. The responses stream is an excerpt (created, one delta, completed) of a real stream.
VLLM_CHAT_STREAM = (
    'data: {"id":"chatcmpl-addc61647782f0ca","object":"chat.completion.chunk","created":1796127450,"model":"qwen","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"prompt_token_ids":null,"prompt_text":null}\n'
    "\n"
    'data: {"id":"chatcmpl-addc61647782f0ca","object":"chat.completion.chunk","created":1796127450,"model":"qwen","choices":[{"index":0,"delta":{"content":"骷"},"logprobs":null,"finish_reason":null,"token_ids":null}]}\n'
    "\n"
    'data: {"id":"chatcmpl-addc61647782f0ca","object":"chat.completion.chunk","created":1796127450,"model":"qwen","choices":[{"index":0,"delta":{"content":" vorhand"},"logprobs":null,"finish_reason":null,"token_ids":null}]}\n'
    "\n"
    'data: {"id":"chatcmpl-addc61647782f0ca","object":"chat.completion.chunk","created":1796127450,"model":"qwen","choices":[{"index":0,"delta":{"content":".removeChild"},"logprobs":null,"finish_reason":"length","stop_reason":null,"token_ids":null}]}\n'
    "\n"
    'data: {"id":"chatcmpl-addc61647782f0ca","object":"chat.completion.chunk","created":1796127450,"model":"qwen","choices":[],"usage":{"prompt_tokens":174,"total_tokens":177,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":128,"created_cache_tokens":0}},"system_fingerprint":"vllm-0.32.0-8589b310"}\n'
    "\n"
    "data: [DONE]\n"
    "\n"
)
VLLM_RESPONSES_STREAM = (
    "event: response.created\n"
    'data: {"response":{"id":"resp_a0ae483211c853dc","created_at":1796127451,"incomplete_details":null,"instructions":null,"metadata":null,"model":"qwen","object":"response","output":[],"parallel_tool_calls":true,"temperature":1.0,"tool_choice":"none","tools":[],"top_p":1.0,"background":false,"max_output_tokens":2,"max_tool_calls":null,"previous_response_id":null,"prompt":null,"reasoning":null,"service_tier":"auto","status":"in_progress","text":null,"top_logprobs":null,"truncation":"disabled","usage":null,"user":null,"presence_penalty":0.0,"frequency_penalty":0.0,"kv_transfer_params":null,"ec_transfer_params":null,"input_messages":null,"output_messages":null},"sequence_number":0,"type":"response.created"}\n'
    "\n"
    "event: response.output_text.delta\n"
    'data: {"content_index":0,"delta":" Semiconductor","item_id":"msg_96c819d2b39c3ee5","logprobs":[],"output_index":0,"sequence_number":4,"type":"response.output_text.delta"}\n'
    "\n"
    "event: response.completed\n"
    'data: {"response":{"id":"resp_a0ae483211c853dc","created_at":1796127451,"incomplete_details":{"reason":"max_output_tokens"},"instructions":null,"metadata":null,"model":"qwen","object":"response","output":[{"id":"msg_96c819d2b39c3ee5","content":[{"annotations":[],"text":" Semiconductor翥","type":"output_text","logprobs":null}],"role":"assistant","status":"completed","type":"message","phase":null}],"parallel_tool_calls":true,"temperature":1.0,"tool_choice":"none","tools":[],"top_p":1.0,"background":false,"max_output_tokens":2,"max_tool_calls":null,"previous_response_id":null,"prompt":null,"reasoning":null,"service_tier":"auto","status":"incomplete","text":null,"top_logprobs":null,"truncation":"disabled","usage":{"input_tokens":36,"input_tokens_details":{"cached_tokens":0,"cache_write_tokens":0,"input_tokens_per_turn":[],"cached_tokens_per_turn":[]},"output_tokens":2,"output_tokens_details":{"reasoning_tokens":0,"tool_output_tokens":0,"output_tokens_per_turn":[],"tool_output_tokens_per_turn":[]},"total_tokens":38},"user":null,"presence_penalty":0.0,"frequency_penalty":0.0,"kv_transfer_params":null,"ec_transfer_params":null,"input_messages":null,"output_messages":null},"sequence_number":9,"type":"response.completed"}\n'
    "\n"
)


def feed(chunks: list[bytes]) -> Usage | None:
    parser = SSEUsageParser()
    for chunk in chunks:
        parser.feed(chunk)
    return parser.result()


def every_way(stream: bytes) -> Usage | None:
    """The stream's usage, checked to be the same whole, one byte at a time and split at every position."""
    whole = feed([stream])
    assert feed([stream[i : i + 1] for i in range(len(stream))]) == whole
    for cut in range(0, len(stream), 5):
        assert feed([stream[:cut], stream[cut:]]) == whole
    return whole


def test_vllm_chat_stream_cached_tokens() -> None:
    usage = every_way("".join(VLLM_CHAT_STREAM).encode())
    assert usage == Usage(174, output_tokens=3, total_tokens=177, cached_tokens=128, reasoning_tokens=None)


def test_vllm_responses_stream_cached_and_reasoning_tokens() -> None:
    """`response.created` carries `"usage": null`; `response.completed` the numbers, details included."""
    usage = every_way("".join(VLLM_RESPONSES_STREAM).encode())
    assert usage == Usage(36, output_tokens=2, total_tokens=38, cached_tokens=0, reasoning_tokens=0)


# llama-server's recordings (tests/data/llama-server): each reports prompt_tokens_details.cached_tokens; the
# streamed ones were recorded after the same request without streaming, so all but the last token was cached.
LLAMA_CACHED = {
    "llama-3-8b-instruct.chat_nonstream": 0,
    "llama-3-8b-instruct.chat_stream_include_usage": 13,
    "llama-3-8b-instruct.completions_nonstream": 1,
    "llama-3-8b-instruct.completions_stream_include_usage": 3,
    "qwen2.5-instruct.chat_nonstream": 0,
    "qwen2.5-instruct.chat_stream_include_usage": 32,
    "qwen2.5-instruct.completions_nonstream": 0,
    "qwen2.5-instruct.completions_stream_include_usage": 2,
}
FIXTURES = [p for p in recorded_fixtures() if p.name.removesuffix(".http") in LLAMA_CACHED]


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_llama_server_recordings_cached_tokens(path) -> None:
    rec = load_recorded(path)
    streamed = b"text/event-stream" in str(rec.headers).encode()
    usage = every_way(rec.body) if streamed else usage_from_json_bytes(rec.body)
    assert usage is not None
    assert usage.cached_tokens == LLAMA_CACHED[rec.name]
    assert usage.output_tokens == 3  # every recording asked for max_tokens 3
    assert usage.reasoning_tokens is None  # llama-server reports no completion_tokens_details


def test_chat_reasoning_tokens_and_absent_details() -> None:
    """OpenAI's chat usage (reasoning models) and vLLM's `"completion_tokens_details": null`."""
    openai = {
        "usage": {
            "prompt_tokens": 20, "completion_tokens": 50, "total_tokens": 70,
            "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 32, "audio_tokens": 0},
        }
    }  # fmt: skip
    assert usage_of(openai) == Usage(20, 50, 70, cached_tokens=0, reasoning_tokens=32)
    vllm = {"usage": {"prompt_tokens": 7, "completion_tokens": 5, "completion_tokens_details": None}}
    assert usage_of(vllm) == Usage(7, 5)
    assert usage_of({"usage": {"prompt_tokens": 7, "prompt_tokens_details": {}}}) == Usage(7)


@pytest.mark.parametrize("bad", [True, -1, "12", 1.5, None, [3]])
def test_a_detail_that_is_not_a_count_is_not_reported(bad: object) -> None:
    usage = usage_of(
        {"usage": {"prompt_tokens": 9, "prompt_tokens_details": {"cached_tokens": bad},
                   "completion_tokens_details": {"reasoning_tokens": bad}}}
    )  # fmt: skip
    assert usage == Usage(9)


def test_responses_json_and_its_details() -> None:
    body = {
        "object": "response",
        "usage": {
            "input_tokens": 36, "output_tokens": 5, "total_tokens": 41,
            "input_tokens_details": {"cached_tokens": 16}, "output_tokens_details": {"reasoning_tokens": 2},
        },
    }  # fmt: skip
    assert usage_from_json_bytes(orjson.dumps(body)) == Usage(36, 5, 41, cached_tokens=16, reasoning_tokens=2)


def test_a_large_body_keeps_the_details() -> None:
    """What the proxy keeps of a large answer (its top-level usage value) still yields every field."""
    body = orjson.dumps(
        {"data": [{"embedding": [0.5] * 40000}],
         "usage": {"prompt_tokens": 12, "total_tokens": 12, "prompt_tokens_details": {"cached_tokens": 4}}}
    )  # fmt: skip
    window = JSONUsageWindow()
    for i in range(0, len(body), 4096):
        window.feed(body[i : i + 4096])
    assert usage_from_json_bytes(window.kept()) == Usage(12, None, 12, cached_tokens=4)


def test_several_prompts_sum_every_field() -> None:
    """llama.cpp's streamed /v1/completions of two prompts: usage on each prompt's finish chunk, no total."""
    events = [
        {"choices": [{"index": 0, "text": "", "finish_reason": "length"}],
         "usage": {"prompt_tokens": 4, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 3}}},
        {"choices": [{"index": 1, "text": "", "finish_reason": "length"}],
         "usage": {"prompt_tokens": 6, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 0}}},
    ]  # fmt: skip
    stream = b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in events) + b"data: [DONE]\n\n"
    assert every_way(stream) == Usage(10, 6, cached_tokens=3)
    one_lacks = [events[0], {**events[1], "usage": {"prompt_tokens": 6, "completion_tokens": 3}}]
    stream = b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in one_lacks)
    assert feed([stream]) == Usage(10, 6, cached_tokens=None)
