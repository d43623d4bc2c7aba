"""Reading a server's answer: reply text and chunk times are the loadgen's own, token counts come from
proxy.core.usage with the proxy's rules (a boolean or a negative count is no count; the responses API's
`input_tokens` is understood), for JSON and SSE answers alike."""

from __future__ import annotations

from functools import cache
from typing import Any

import orjson
import pytest
from aiohttp import web

from loadgen.config import LoadgenConfig
from loadgen.send.replies import StreamTimer, json_outcome
from loadgen.send.runner import Engine
from loadgen.workload.conversations import Workload
from tests.builders import build_tokenizer

# Each event ends with its blank line, as servers send them (an event's data lines are joined: WHATWG).
STREAM = [
    b'data: {"choices":[{"delta":{"role":"assistant"}}]}\n\n',
    b": keep-alive\n\n",
    b'data: {"choices":[{"delta":{"content":"Hel"}}]}\n\n',
    b"data: not json\n\n",
    b'data: {"choices":[{"delta":{"content":"lo"}}]}\n\n',
    b'data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":2}}\n\n',
    b"data: [DONE]\n\n",
]
USAGES = [
    pytest.param({"prompt_tokens": True, "completion_tokens": 3}, None, id="true-is-no-count"),
    pytest.param({"prompt_tokens": -5, "completion_tokens": 3}, None, id="negative-is-no-count"),
    pytest.param({"prompt_tokens": 7, "completion_tokens": 3}, 7, id="prompt_tokens"),
    pytest.param({"input_tokens": 7, "output_tokens": 3}, 7, id="responses-api-input_tokens"),
]


@cache
def chatml() -> Any:
    return build_tokenizer("chatml")


def json_answer(usage: dict[str, Any]) -> bytes:
    choice = {"index": 0, "message": {"role": "assistant", "content": "Hi"}, "finish_reason": "stop"}
    return orjson.dumps({"choices": [choice], "usage": usage})


def sse_answer(usage: dict[str, Any]) -> bytes:
    events = [{"choices": [{"index": 0, "delta": {"content": "Hi"}}]}, {"choices": [], "usage": usage}]
    return b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in events) + b"data: [DONE]\n\n"


def timed(lines: list[bytes]) -> StreamTimer:
    t = StreamTimer()
    for i, line in enumerate(lines):
        t.feed_line(line, float(i))
    return t


def test_stream_timer_keeps_content_text_and_its_times() -> None:
    t = timed(STREAM)
    assert t.reply == "Hello" and t.times == [2.0, 4.0]


def test_stream_timer_reads_the_usage_chunk() -> None:
    usage = timed(STREAM).usage()
    assert usage is not None and (usage.input_tokens, usage.output_tokens) == (7, 2)


def test_stream_timer_reads_a_last_line_without_newline() -> None:
    usage = timed([*STREAM[:5], STREAM[5].rstrip(b"\n")]).usage()
    assert usage is not None and usage.input_tokens == 7


def test_stream_outcome_counts_chunks_when_usage_has_no_output_count() -> None:
    t = timed([*STREAM[:5], b'data: {"choices":[],"usage":{"prompt_tokens":7}}\n'])
    out = t.outcome(start=1.0, end=5.0)
    assert (out.prompt_tokens, out.output_tokens, out.reply) == (7, 2, "Hello")
    assert (out.latency_ms, out.ttft_ms, out.itl_ms) == (4000.0, 1000.0, 2000.0)


@pytest.mark.parametrize(("usage", "expected"), USAGES)
def test_stream_prompt_count_follows_the_proxy_rules(usage: dict[str, Any], expected: int | None) -> None:
    out = timed(sse_answer(usage).splitlines(keepends=True)).outcome(0.0, 1.0)
    assert out.prompt_tokens == expected


@pytest.mark.parametrize(("usage", "expected"), USAGES)
def test_json_prompt_count_follows_the_proxy_rules(usage: dict[str, Any], expected: int | None) -> None:
    assert json_outcome(200, json_answer(usage), 1.0).prompt_tokens == expected


def test_json_answer_with_an_http_error_has_no_counts() -> None:
    out = json_outcome(500, json_answer({"prompt_tokens": 7}), 1.0)
    assert (out.status, out.error, out.prompt_tokens, out.reply) == (500, "HTTP 500", None, None)


async def record_of(aiohttp_server: Any, body: bytes, streaming: bool) -> Any:
    """The record of one request to a server that answers `body` to every chat request."""

    async def answer(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=body, content_type="text/event-stream" if streaming else "application/json")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", answer)
    server = await aiohttp_server(app)
    cfg = LoadgenConfig(
        url=str(server.make_url("/")), isl=64, osl=4, concurrency=1, request_count=1, streaming=streaming
    )
    (record,) = await Engine(cfg, Workload(chatml(), cfg)).run()
    assert record.status == 200 and record.error is None, record
    return record


@pytest.mark.parametrize(("usage", "expected"), USAGES)
async def test_server_prompt_tokens_of_a_json_answer(
    aiohttp_server: Any, usage: dict[str, Any], expected: int | None
) -> None:
    record = await record_of(aiohttp_server, json_answer(usage), streaming=False)
    assert record.server_prompt_tokens == expected


@pytest.mark.parametrize(("usage", "expected"), USAGES)
async def test_server_prompt_tokens_of_a_streamed_answer(
    aiohttp_server: Any, usage: dict[str, Any], expected: int | None
) -> None:
    record = await record_of(aiohttp_server, sse_answer(usage), streaming=True)
    assert record.server_prompt_tokens == expected
