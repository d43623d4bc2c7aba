"""Anthropic Messages usage as the three servers write it (core/usage.py): the prompt is input_tokens plus
the prefix-cache reads and writes, the output count rides on message_delta, a 0 input is no count, and
count_tokens' top-level input_tokens is the whole prompt. Streams are fed whole and split at every byte."""

from __future__ import annotations

import orjson
import pytest

from proxy.core.usage import SSEUsageParser, Usage, usage_from_json_bytes


def event(kind: str, obj: dict[str, object]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps({"type": kind, **obj}) + b"\n\n"


def start(usage: dict[str, int]) -> bytes:
    return event(
        "message_start", {"message": {"id": "msg_1", "type": "message", "content": [], "usage": usage}}
    )


TEXT = event("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": "usage"}})
STOP = event("message_stop", {})
STREAMS = {
    # vLLM (anthropic/serving.py): input in message_start, and again with the output in message_delta
    "vllm_cached": (
        start({"input_tokens": 20, "output_tokens": 0, "cache_read_input_tokens": 96})
        + TEXT
        + event(
            "message_delta",
            {"delta": {}, "usage": {"input_tokens": 20, "output_tokens": 4, "cache_read_input_tokens": 96}},
        )
        + STOP,
        Usage(116, 4, cached_tokens=96),
    ),
    # llama-server (server-task.cpp to_json_anthropic): message_delta carries the output count alone
    "llama_cpp_cached": (
        start({"cache_read_input_tokens": 61, "input_tokens": 2, "output_tokens": 0})
        + TEXT
        + event("message_delta", {"delta": {"stop_reason": "max_tokens"}, "usage": {"output_tokens": 3}})
        + STOP,
        Usage(63, 3, cached_tokens=61),
    ),
    # SGLang (anthropic/serving.py): message_start says 0 when no usage came before it: no count
    "sglang_zero": (
        start({"input_tokens": 0, "output_tokens": 0})
        + event("message_delta", {"usage": {"output_tokens": 1}})
        + STOP,
        None,
    ),
}


@pytest.mark.parametrize("name", list(STREAMS))
def test_stream_usage_at_every_split(name: str) -> None:
    raw, expected = STREAMS[name]
    for cut in range(len(raw) + 1):
        parser = SSEUsageParser()
        parser.feed(raw[:cut])
        parser.feed(raw[cut:])
        got = parser.result()
        assert (got if expected is None else (got.input_tokens, got.output_tokens, got.cached_tokens)) == (
            None
            if expected is None
            else (expected.input_tokens, expected.output_tokens, expected.cached_tokens)
        ), (name, cut, got)


def test_json_usage_adds_the_cache_back() -> None:
    answer = {"id": "msg_1", "type": "message", "content": [], "usage": {
        "input_tokens": 10, "output_tokens": 2, "cache_read_input_tokens": 32, "cache_creation_input_tokens": 5}}  # fmt: skip
    usage = usage_from_json_bytes(orjson.dumps(answer))
    assert usage is not None and (usage.input_tokens, usage.cached_tokens) == (47, 32)


def test_count_tokens_answer_is_the_prompt() -> None:
    usage = usage_from_json_bytes(
        b'{"input_tokens": 42, "context_management": {"original_input_tokens": 42}}'
    )
    assert usage is not None and usage.input_tokens == 42 and usage.output_tokens is None


def test_a_zero_prompt_is_no_count_only_where_no_prompt_can_be_zero() -> None:
    assert usage_from_json_bytes(b'{"usage": {"input_tokens": 0, "output_tokens": 0}}') is None
    chat = usage_from_json_bytes(b'{"usage": {"prompt_tokens": 0, "completion_tokens": 0}}')
    assert chat is not None and chat.input_tokens == 0  # chat's field is read as sent (unchanged rule)
