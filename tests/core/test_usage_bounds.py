"""What islwatch holds of an answer while relaying it is bounded by bytes, and nothing is held hostage.

A 25 MiB line without a newline fed one chunk at a time: the stripper passes its bytes on as they arrive
(holding at most MAX_LINE_BYTES), the parser skips it without reading its fragments as events, and both
resume on the next line. A JSON answer is kept whole only while small; a big one keeps only usage windows,
and the usage is still found wherever the server put it: last (OpenAI, vLLM), first (llama.cpp embeddings:
model, object, usage, data), or before a long trailer (vLLM's prompt_token_ids after usage).
"""

from __future__ import annotations

import random

import aiohttp
import orjson
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from proxy.core.buffers import JSON_WHOLE_BYTES, USAGE_WINDOW_BYTES, JSONUsageWindow
from proxy.core.sse import MAX_LINE_BYTES
from proxy.core.usage import SSEUsageParser, SSEUsageStripper, Usage, usage_from_json_bytes
from proxy.server.app import run_proxy
from tests.server.helpers import proxy_config, serve_app, settled, value, wait_metrics

MIB = 1 << 20
CHUNK = 64 << 10  # what aiohttp's iter_any typically hands over
USAGE = {"prompt_tokens": 12, "completion_tokens": 2, "total_tokens": 14}
FINAL = b"data: " + orjson.dumps({"id": "x", "choices": [], "usage": USAGE}) + b"\n\n"
DONE = b"data: [DONE]\n\n"


def _chunks(data: bytes, size: int = CHUNK) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


def _random_chunks(data: bytes, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    out, i = [], 0
    while i < len(data):
        n = rng.choice((1, 7, 500, 4096, 70_000))
        out.append(data[i : i + n])
        i += n
    return out


def test_a_25_mib_line_is_passed_on_as_it_arrives() -> None:
    """No newline in 25 MiB: the client still gets every byte but the last MAX_LINE_BYTES before the line
    ends, the rest when it does; the injected usage chunk after it is still stripped."""
    line = b"data: " + b"x" * (25 * MIB)
    stripper = SSEUsageStripper()
    released = 0
    for chunk in _chunks(line):
        released += len(stripper.feed(chunk))
        assert stripper.held <= MAX_LINE_BYTES
    assert released >= len(line) - MAX_LINE_BYTES
    rest = stripper.feed(b"\n\n" + FINAL + DONE) + stripper.flush()
    assert released + len(rest) == len(line) + 2 + len(DONE)
    assert rest.endswith(b"\n\n" + DONE)  # the usage-only chunk was removed, the line's end kept
    assert stripper.result() == Usage(12, 2, 14)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_an_over_long_line_comes_out_byte_for_byte_in_any_chunking(seed: int) -> None:
    """A line that carries `"usage": null` (OpenAI's shape) is passed on unchanged, over-long or not: the
    stripper only takes out the usage-only event."""
    ordinary = b'data: {"choices":[{"index":0,"delta":{"content":"a"}}],"usage":null}\n\n'
    long_event = b'data: {"choices":[{"delta":{"content":"' + b"y" * (3 * MIB) + b'"}}],"usage":null}\n\n'
    stream = ordinary + long_event + ordinary + FINAL + DONE
    stripper = SSEUsageStripper()
    out = b"".join(stripper.feed(c) for c in _random_chunks(stream, seed)) + stripper.flush()
    assert out == ordinary + long_event + ordinary + DONE


def test_the_parser_skips_an_over_long_line_and_reads_on() -> None:
    parser = SSEUsageParser()
    for chunk in _chunks(b"data: " + b"z" * (25 * MIB)):
        parser.feed(chunk)
    parser.feed(b"\n\n" + FINAL)
    assert parser.result() == Usage(12, 2, 14)


def test_a_fragment_of_an_over_long_line_is_not_read_as_an_event() -> None:
    """Bytes deep inside a line that looks like a usage event are content of that line, not an event."""
    fake = b'data: {"choices":[],"usage":{"prompt_tokens":99}}'
    parser = SSEUsageParser()
    # The line passes MAX_LINE_BYTES on the chunk just before the fake, which starts a chunk of its own.
    long_start = b"data: " + b"q" * (MAX_LINE_BYTES + CHUNK - 6)
    for chunk in [*_chunks(long_start), fake, b"\n\n" + DONE]:
        parser.feed(chunk)
    assert parser.result() is None


def _answer(usage_first: bool, trailer: int = 0, filler: int = 20 * MIB) -> bytes:
    """A JSON answer with a `filler`-byte data part, usage first or last, then a `trailer`-byte field."""
    data = [{"embedding": "A" * filler, "index": 0}]
    usage = {"prompt_tokens": 31, "total_tokens": 31}
    head = {"model": "m", "object": "list"}
    fields = {**head, "usage": usage, "data": data} if usage_first else {**head, "data": data, "usage": usage}
    if trailer:
        fields["prompt_token_ids"] = list(range(trailer // 7))
    return orjson.dumps(fields)


@pytest.mark.parametrize(
    ("usage_first", "trailer"),
    [(False, 0), (True, 0), (False, 2 * MIB)],
    ids=["usage-last", "usage-first-llama.cpp-embeddings", "usage-before-a-long-trailer"],
)
def test_a_big_json_answer_keeps_only_bounded_windows_and_finds_usage(
    usage_first: bool, trailer: int
) -> None:
    body = _answer(usage_first, trailer)
    window = JSONUsageWindow()
    most = 0
    for chunk in _chunks(body):
        window.feed(chunk)
        most = max(most, window.held)
    assert most <= JSON_WHOLE_BYTES + 2 * USAGE_WINDOW_BYTES
    kept = window.kept()
    assert len(kept) <= USAGE_WINDOW_BYTES + 16
    assert usage_from_json_bytes(kept) == Usage(31, None, 31)


def test_a_usage_key_split_across_chunks_is_found() -> None:
    body = _answer(usage_first=False, filler=200_000)
    at = body.index(b'"usage"')
    for cut in range(at - 2, at + 10):
        window = JSONUsageWindow()
        for part in (body[:cut], body[cut:]):
            window.feed(part)
        assert usage_from_json_bytes(window.kept()) == Usage(31, None, 31), cut


def test_a_small_answer_is_kept_whole() -> None:
    body = orjson.dumps({"choices": [], "usage": USAGE})
    window = JSONUsageWindow()
    for part in _chunks(body, 5):
        window.feed(part)
    assert window.kept() == body


def test_usage_quoted_inside_a_big_answer_is_not_usage() -> None:
    """Text that quotes a usage object is a string's content, not a member."""
    quoted = '"usage": {"prompt_tokens": 5}'
    body = orjson.dumps({"choices": [{"message": {"content": quoted * 20_000}}]})
    window = JSONUsageWindow()
    for chunk in _chunks(body):
        window.feed(chunk)
    assert window.kept() == b"" and usage_from_json_bytes(window.kept()) is None


# ---- through the proxy: the usage tap on the response path ------------------------------------------------


async def test_big_json_answers_through_the_proxy_are_measured() -> None:
    """20 MiB answers, relayed byte for byte; the server's count is read whether usage comes last (a chat
    answer) or first (llama.cpp's embeddings layout)."""
    answers = {
        "/v1/chat/completions": _answer(usage_first=False),
        "/v1/embeddings": _answer(usage_first=True),
    }

    async def handle(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=answers[request.path], content_type="application/json")

    upstream = web.Application()
    upstream.router.add_post("/{tail:.*}", handle)
    requests = {
        "/v1/chat/completions": {"model": "m", "messages": [{"role": "user", "content": "Hello"}]},
        "/v1/embeddings": {"model": "m", "input": "Hello"},
    }
    async with (
        serve_app(upstream) as up,
        aiohttp.ClientSession() as session,
        run_proxy(proxy_config(up), CollectorRegistry()) as (url, admin_url, _),
    ):
        for path, body in requests.items():
            async with session.post(url + path, json=body) as resp:
                assert resp.status == 200 and await resp.read() == answers[path]
        samples = await wait_metrics(
            session,
            admin_url,
            lambda s: settled(s) and value(s, "islwatch_isl_tokens_count", kind="server") == 2,
        )
    assert value(samples, "islwatch_isl_tokens_sum", kind="server") == 2 * 31
    assert value(samples, "islwatch_isl_match_total", result="no_server_count") == 0


@pytest.mark.parametrize("seed", range(20))
def test_the_stream_parser_finds_usage_in_any_chunking_after_lines_that_hold_none(seed: int) -> None:
    """Chunks without a usage key skip line splitting (SSEUsageParser.feed): whatever the cuts, after
    ordinary events and an over-long line, a usage key straddling two chunks is still read."""
    rng = random.Random(seed)
    event = b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\n'
    stream = event * 30 + b"data: " + b"x" * (MAX_LINE_BYTES + 10) + b"\n\n" + event * 3 + FINAL + DONE
    cuts = [*rng.sample(range(1, len(stream)), 40), stream.index(b'"usage"') + rng.randrange(1, 7)]
    parser = SSEUsageParser()
    start = 0
    for cut in sorted(set(cuts)):
        parser.feed(stream[start:cut])
        start = cut
    parser.feed(stream[start:])
    whole = SSEUsageParser()
    whole.feed(stream)  # one chunk holding the key: every line split and read
    assert parser.result() == whole.result()
    assert (whole.result().input_tokens, whole.result().output_tokens) == (12, 2)  # type: ignore[union-attr]
