"""Usage parsers on real bytes: recorded llama-server streams fed one byte at a time, OpenAI and
/v1/responses shapes, bad lines; and the stripper that undoes --inject-stream-usage."""

from __future__ import annotations

import orjson
import pytest

from proxy.core.usage import SSEUsageParser, SSEUsageStripper, Usage, usage_from_json_bytes, usage_of
from tests.server.helpers import load_recorded, recorded_fixtures, sse_events

FIXTURES = recorded_fixtures()
# What each recording says the server counted (README of the fixtures, and the bodies themselves).
EXPECTED = {
    "llama-3-8b-instruct.chat_nonstream": 14,
    "llama-3-8b-instruct.chat_stream_include_usage": 14,
    "llama-3-8b-instruct.chat_stream_no_usage": None,
    "llama-3-8b-instruct.completions_nonstream": 4,
    "llama-3-8b-instruct.completions_stream_include_usage": 4,
    "qwen2.5-instruct.chat_nonstream": 33,
    "qwen2.5-instruct.chat_stream_include_usage": 33,
    "qwen2.5-instruct.chat_stream_no_usage": None,
    "qwen2.5-instruct.completions_nonstream": 3,
    "qwen2.5-instruct.completions_stream_include_usage": 3,
}


def _parse_stream(chunks: list[bytes]) -> Usage | None:
    parser = SSEUsageParser()
    for chunk in chunks:
        parser.feed(chunk)
    return parser.result()


USAGE_FIXTURES = [p for p in FIXTURES if p.name.removesuffix(".http") in EXPECTED]


def test_every_recording_is_checked() -> None:
    """The usage recordings here, the error ones (no usage) in test_error_recording_has_no_usage."""
    errors = [p for p in FIXTURES if p.stem.endswith("bad_json")]
    assert len(USAGE_FIXTURES) == len(EXPECTED) and len(USAGE_FIXTURES) + len(errors) == len(FIXTURES)


@pytest.mark.parametrize("path", USAGE_FIXTURES, ids=lambda p: p.stem)
def test_recorded_llama_server_usage_every_chunk_boundary(path) -> None:
    rec = load_recorded(path)
    expected = EXPECTED[rec.name]
    if b"text/event-stream" in str(rec.headers).encode():
        whole = _parse_stream([rec.body])
        assert (whole.input_tokens if whole else None) == expected
        one_byte = _parse_stream([rec.body[i : i + 1] for i in range(len(rec.body))])
        assert one_byte == whole
        for cut in range(0, len(rec.body), 7):  # every 2-piece split, strided to keep the test quick
            assert _parse_stream([rec.body[:cut], rec.body[cut:]]) == whole
    else:
        usage = usage_from_json_bytes(rec.body)
        assert usage is not None and usage.input_tokens == expected


def test_error_recording_has_no_usage() -> None:
    for path in FIXTURES:
        rec = load_recorded(path)
        if rec.name.endswith("bad_json"):
            assert rec.status == 500
            assert usage_from_json_bytes(rec.body) is None


def test_openai_null_usage_chunks_and_final_usage_chunk() -> None:
    body = b"".join(sse_events(include_usage=True, null_usage=True))
    assert _parse_stream([body[i : i + 1] for i in range(len(body))]) == Usage(12, 2, 14, None)
    assert _parse_stream([b"".join(sse_events(include_usage=False, null_usage=True))]) is None


def test_latest_non_null_usage_wins_and_bad_lines_are_skipped() -> None:
    stream = (
        b": keep-alive comment\n"
        b"event: message\n"
        b'data: {"usage": {"prompt_tokens": 5}}\r\n\r\n'
        b'data: {"usage": {"prompt_tokens": \n\n'  # truncated JSON: skipped
        b'data: {"usage": null, "choices": []}\n\n'  # null never replaces a count
        b'data: {"usage": {"prompt_tokens": 9, "completion_tokens": 3}}\n\n'
        b'data: {"usage": {"prompt_tokens": true}}\n\n'  # not a count
        b"data: [DONE]"  # no final newline
    )
    assert _parse_stream([stream]).input_tokens == 9


def test_responses_api_events() -> None:
    created = {"type": "response.created", "response": {"id": "r", "usage": None}}
    done = {
        "type": "response.completed",
        "response": {
            "id": "r",
            "usage": {
                "input_tokens": 21,
                "output_tokens": 4,
                "total_tokens": 25,
                "input_tokens_details": {"cached_tokens": 2},
            },
        },
    }
    stream = b"".join(
        b"event: " + e["type"].encode() + b"\ndata: " + orjson.dumps(e) + b"\n\n" for e in (created, done)
    )
    assert _parse_stream([stream]) == Usage(21, 4, 25, 2)
    assert usage_of(done["response"]) == Usage(21, 4, 25, 2)  # the non-streamed response object


def test_json_usage_of_the_whole_answer_only() -> None:
    body = orjson.dumps(
        {"data": [{"embedding": [0.5] * 2000}], "usage": {"prompt_tokens": 8, "total_tokens": 8}}
    )
    assert usage_from_json_bytes(body).input_tokens == 8
    assert usage_from_json_bytes(body[-200:]) is None  # a tail is not an answer: its usage may be nested
    assert usage_from_json_bytes(b'{"content": "\\"usage\\": {\\"prompt_tokens\\": 3}"}') is None
    assert usage_from_json_bytes(b"not json") is None


@pytest.mark.parametrize("null_usage", [True, False])
def test_stripper_takes_out_the_usage_only_event(null_usage: bool) -> None:
    """The usage-only event goes; `"usage": null` on the other chunks stays (a server may send it unasked)."""
    injected = b"".join(sse_events(include_usage=True, null_usage=null_usage))
    plain = b"".join(
        e for e in sse_events(include_usage=True, null_usage=null_usage) if b'"choices":[]' not in e
    )
    for step in (1, 3, len(injected)):
        stripper = SSEUsageStripper()
        out = b"".join(stripper.feed(injected[i : i + step]) for i in range(0, len(injected), step))
        out += stripper.flush()
        assert out == plain
        assert stripper.result() is not None and stripper.result().input_tokens == 12


def test_stripper_keeps_llama_cpp_completions_finish_chunk_usage() -> None:
    # llama.cpp's completions stream carries usage on the finish chunk (with choices), with or without
    # include_usage: it is not an injected extra, so it stays.
    rec = load_recorded(FIXTURE_DIR_FILE("llama-3-8b-instruct.completions_stream_include_usage"))
    stripper = SSEUsageStripper()
    assert stripper.feed(rec.body) + stripper.flush() == rec.body
    # The chat recording's usage-only chunk is the injected extra: dropped, everything else kept.
    chat = load_recorded(FIXTURE_DIR_FILE("llama-3-8b-instruct.chat_stream_include_usage"))
    stripper = SSEUsageStripper()
    out = stripper.feed(chat.body) + stripper.flush()
    events = [e for e in chat.body.split(b"\n\n") if e]
    assert out == b"".join(e + b"\n\n" for e in events if b'"choices":[]' not in e)


def FIXTURE_DIR_FILE(name: str):
    return next(p for p in FIXTURES if p.stem == name)
