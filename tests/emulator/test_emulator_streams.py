"""Server-sent event streams: one token per chunk, usage where asked for, joining to the JSON answer."""

from __future__ import annotations

from typing import Any

from tests.conftest import load_builtin
from tests.emulator.emulator_helpers import (
    CHAT,
    FRANCE,
    THREE,
    direct_count,
    emulator,
    encode_len,
    post,
    responses_count,
    sse_data,
    stats,
)

USAGE = {"include_usage": True}


async def test_chat_stream_without_usage(aiohttp_client: Any) -> None:
    client = await emulator(aiohttp_client, load_builtin().tokenizer)
    resp = await client.post(CHAT, json={"messages": FRANCE, "max_tokens": 4, "stream": True})
    assert resp.headers["Content-Type"].startswith("text/event-stream")
    raw = await resp.text()
    assert "usage" not in raw
    events = sse_data(raw)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * 5 + ["length"]
    streamed = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    _, full = await post(client, CHAT, {"messages": FRANCE, "max_tokens": 4})
    assert streamed == full["choices"][0]["message"]["content"]


async def test_chat_stream_with_usage(aiohttp_client: Any) -> None:
    tok = load_builtin().tokenizer
    client = await emulator(aiohttp_client, tok)
    body = {"messages": THREE, "max_tokens": 3, "stream": True, "stream_options": USAGE}
    events = sse_data(await (await client.post(CHAT, json=body)).text())
    assert events[-1] == "[DONE]"
    last = events[-2]
    assert last["choices"] == []
    assert last["usage"] == {
        "prompt_tokens": direct_count(tok, THREE),
        "total_tokens": direct_count(tok, THREE) + 3,
        "completion_tokens": 3,
    }
    assert all("usage" not in e for e in events[:-2])


async def test_chat_stream_continuous_usage(aiohttp_client: Any) -> None:
    """vLLM's continuous_usage_stats: usage on every chunk, completion tokens so far."""
    client = await emulator(aiohttp_client, load_builtin().tokenizer)
    options = {**USAGE, "continuous_usage_stats": True}
    body = {"messages": THREE, "max_tokens": 3, "stream": True, "stream_options": options}
    events = sse_data(await (await client.post(CHAT, json=body)).text())
    assert [e["usage"]["completion_tokens"] for e in events[:-1]] == [0, 1, 2, 3, 3, 3]


async def test_completions_stream(aiohttp_client: Any) -> None:
    tok = load_builtin().tokenizer
    client = await emulator(aiohttp_client, tok)
    body = {"prompt": "Once upon", "max_tokens": 2, "stream": True, "stream_options": USAGE}
    events = sse_data(await (await client.post("/v1/completions", json=body)).text())
    assert "".join(e["choices"][0]["text"] for e in events[:-2]) == "the the"
    assert events[-2]["usage"]["prompt_tokens"] == encode_len(tok, "Once upon", True)


async def test_responses_stream_completed_carries_usage(aiohttp_client: Any) -> None:
    tok = load_builtin().tokenizer
    client = await emulator(aiohttp_client, tok)
    raw = await (await client.post("/v1/responses", json={"input": "Hi there", "stream": True})).text()
    events = sse_data(raw)
    assert events[0]["type"] == "response.created" and events[-1]["type"] == "response.completed"
    assert "event: response.completed\n" in raw
    deltas = [e["delta"] for e in events if e["type"] == "response.output_text.delta"]
    assert len(deltas) == 16
    usage = events[-1]["response"]["usage"]
    assert usage["input_tokens"] == responses_count(tok, [{"role": "user", "content": "Hi there"}])
    assert usage["output_tokens"] == 16
    assert [e["sequence_number"] for e in events] == list(range(len(events)))


async def test_stream_chunks_are_flushed_one_by_one(aiohttp_client: Any) -> None:
    """With a gap between chunks the first chunk arrives while the emulator is still writing the rest."""
    client = await emulator(aiohttp_client, load_builtin().tokenizer, "token-latency=50ms")
    resp = await client.post(CHAT, json={"messages": FRANCE, "max_tokens": 20, "stream": True})
    first = await resp.content.readuntil(b"\n\n")
    assert b'"role":"assistant"' in first
    counters = await stats(client)
    assert counters["streams_started"] == 1 and counters["streams_completed"] == 0
    rest = await resp.read()
    assert rest.endswith(b"data: [DONE]\n\n")
