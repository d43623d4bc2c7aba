"""A log canary: one random string in every field a client controls (header names and values, path, query,
method, body, JSON keys and values, content part and input item types, model and tool names), sent as
well-formed, malformed and hostile requests, and the string must never reach a log line, while each problem
is counted and logged once (one throttled line per kind). The proxy runs both as the `islwatch proxy`
process (its whole stdout and stderr are read) and in this process (every Python log record, DEBUG up, with
its traceback)."""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import orjson
import pytest

from proxy.server.app import run_proxy
from tests.eventually import eventually_async
from tests.reliability.reliability_peers import Origin, free_port, recording_origin, running, start_proxy
from tests.server.helpers import proxy_config, value, wait_metrics

CANARY = "cnry" + secrets.token_hex(6)
C = CANARY.encode()
MAX_BODY = 4096
BODY_TIMEOUT = 1.0  # the broken streamed body is cut after this: small, so the test does not wait long
REPEATS = 12  # of each malformed head: the log must still say it once
READ_GUARD_SECONDS = 30.0  # bounds a hung read; not a timing assertion


def _post(path: bytes, body: bytes, *headers: bytes) -> bytes:
    head = b"POST %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: %d\r\n" % (path, len(body))
    return head + b"".join(h + b"\r\n" for h in headers) + b"\r\n" + body


def _json(path: bytes, obj: object, *headers: bytes) -> bytes:
    return _post(path, orjson.dumps(obj), b"Content-Type: application/json", *headers)


def _chat(**fields: object) -> dict[str, object]:
    return {"model": "known", "max_tokens": 1, "messages": [{"role": "user", "content": CANARY}], **fields}


def malformed_heads() -> list[bytes]:
    """Requests aiohttp's parser refuses with a 400 (and aiohttp would log with the raw bytes)."""
    chat = orjson.dumps(_chat())
    return [
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\x01z\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (C, len(chat), chat),
        # A chunked body 5 bytes short: the next request's line is read as a chunk size.
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n"
        b"0\r\n\r\nGET /%s HTTP/1.1\r\n\r\n" % (len(chat) + 5, chat, C),
        b"GET /%s%s HTTP/1.1\r\nHost: x\r\n\r\n" % (C, b"a" * 9000),  # a request line too long
        b"GET / HTTP/1.1\r\nHost: x\r\nX-%s bad: 1\r\n\r\n" % C,  # a space in a field name
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %s\r\n\r\n" % C,
        b"GET /%s HTTP/1.1\r\nHost: x\r\nX-Long: %s\r\n\r\n" % (C, C * 1000),  # a field too long
        b"%s /%s HTTP/1.1\r\nHost: x\r\n\r\n" % (C.upper(), C),  # a method llhttp does not know
    ]


USER = [{"role": "user", "content": CANARY}]


def well_formed() -> list[bytes]:
    """Requests that are relayed; each carries the canary where a client can put it."""
    q = b"/v1/chat/completions?%s=%s" % (C, C)
    everywhere = (b"Authorization: Bearer " + C, b"X-" + C + b": " + C, b"Cookie: " + C + b"=" + C,
                  b"User-Agent: " + C)  # fmt: skip
    parts = [{"type": CANARY, "text": CANARY}, {"type": "text", "text": CANARY}]
    tools = [{"type": "function", "function": {"name": CANARY, "description": CANARY, "parameters": {}}}]
    return [
        _json(q, _chat(), *everywhere),
        _json(b"/v1/chat/completions", _chat(model=CANARY)),  # an unknown model
        _json(b"/v1/chat/completions", _chat(messages=[{"role": "user", "content": parts}])),
        _json(b"/v1/chat/completions", _chat(messages=[{"role": "system", "content": CANARY}, *USER])),
        _json(b"/v1/chat/completions", {**_chat(tools=tools), CANARY: {CANARY: [CANARY]}}),
        _json(b"/v1/chat/completions", _chat(messages=[{"role": CANARY, "content": CANARY, CANARY: 1}])),
        _json(b"/v1/chat/completions", _chat(stream=True, stream_options={"include_usage": True})),
        _json(b"/v1/chat/completions", _chat(chat_template_kwargs={CANARY: CANARY, "messages": CANARY})),
        _json(b"/v1/responses", {"model": "known", "input": [{"type": CANARY, "content": CANARY}]}),
        _json(b"/v1/completions", {"model": "known", "prompt": CANARY, CANARY: CANARY}),
        _json(b"/v1/embeddings", {"model": CANARY, "input": [CANARY, 7]}),
        _post(b"/v1/chat/completions", b'{"model": "%s", ' % C, b"Content-Type: application/json"),
        _post(b"/v1/chat/completions", b'{"model": "%s\xff"}' % C, b"Content-Type: application/json"),
        _post(b"/v1/chat/completions", orjson.dumps(_chat()), b"Content-Type: text/" + C),
        _json(b"/v1/chat/completions", _chat(messages=[{"role": "user", "content": CANARY * 400}])),
    ]


async def send(port: int, payload: bytes) -> bytes:
    """One request on its own connection; everything the proxy sends until it closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(payload)
        await writer.drain()
        async with asyncio.timeout(READ_GUARD_SECONDS):
            return await reader.read()
    finally:
        writer.close()


async def broken_streamed_body(port: int, origin: Origin) -> None:
    """A chunked body relayed as it arrives (a path islwatch does not analyse) whose framing breaks once the
    upstream has its first bytes. aiohttp's C parser then drops the error (the body just stops: cut after
    body_timeout); its Python parser hands it to the body's reader (malformed_body). Either way: closed."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"POST /%s HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n" % C)
        await writer.drain()
        await eventually_async(lambda: b"first" in origin.received(), what="the first chunk upstream")
        writer.write(b"%s\r\n\r\n" % C)  # not a chunk size
        await writer.drain()
        async with asyncio.timeout(READ_GUARD_SECONDS):
            assert await reader.read() == b""  # closed: no answer exists for a broken body
    finally:
        writer.close()


async def send_all(port: int, origin: Origin) -> None:
    for payload in malformed_heads():
        for _ in range(REPEATS):
            answer = await send(port, payload)
            # 400 and closed; a body error read after its head was handled: closed without an answer.
            assert answer == b"" or answer.split(b" ", 2)[1] == b"400", answer[:200]
    assert await send(port, b"\x16\x03\x01\x02\x00%s\r\n\r\n" % C) != b""  # TLS bytes on the plain port
    for payload in well_formed():
        answer = await send(port, payload)
        assert answer.startswith(b"HTTP/1.1 "), answer[:200]
    await broken_streamed_body(port, origin)


# Each malformed request counts once, as a head (400) or a body (closed), plus the TLS bytes and the
# streamed break (malformed_body, or cut as body_timeout).
MALFORMED = len(malformed_heads()) * REPEATS + 2


async def settled_metrics(admin_url: str) -> dict[object, float]:
    def done(m: dict[object, float]) -> bool:
        return value(m, "islwatch_analysis_queue_depth") == 0 and (
            # one canary body is a request vLLM refuses (counted as server_refuses), one is no request
            value(m, "islwatch_bad_requests_total", reason="not_a_request")
            + value(m, "islwatch_bad_requests_total", reason="server_refuses")
            >= 2
        )

    async with aiohttp.ClientSession() as s:
        return await wait_metrics(s, admin_url, done)


def check_counts(m: dict[object, float]) -> None:
    head = value(m, "islwatch_bad_requests_total", reason="malformed_head")
    body = value(m, "islwatch_bad_requests_total", reason="malformed_body")
    cut = value(m, "islwatch_client_connections_cut_total", reason="body_timeout")
    assert head + body + cut == MALFORMED and body + cut >= 1
    for reason in ("invalid_json", "non_utf8", "wrong_content_type", "body_too_large"):
        assert value(m, "islwatch_bad_requests_total", reason=reason) == 1, reason
    assert value(m, "islwatch_bad_requests_total", reason="unknown_model") == 2  # chat and embeddings
    assert value(m, "islwatch_fallback_total", reason="template_error") >= 1  # a system role for Mistral
    assert value(m, "islwatch_analysis_errors_total") == 0


def check_log(text: str, kinds: tuple[str, ...]) -> None:
    """No canary, no traceback; each kind logged, and repeats summarised rather than one line each."""
    assert CANARY not in text and CANARY.upper() not in text
    assert "Traceback" not in text
    for kind in kinds:
        lines = [line for line in text.splitlines() if f"{kind}:" in line]
        assert lines, f"nothing logged for {kind}: the canary check would prove nothing"
    malformed = [line for line in text.splitlines() if "malformed_head:" in line]
    assert len(malformed) <= MALFORMED // REPEATS, malformed  # unthrottled: one line per request


KINDS = (
    "malformed_head",
    "body_timeout",
    "not_a_request",
    "unknown_model",
    "invalid_json",
)


async def test_the_canary_never_reaches_the_proxy_process_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ISLWATCH_LOG_LEVEL", "DEBUG")
    log = tmp_path / "proxy.log"  # the process's stdout and stderr
    async with recording_origin() as origin:
        args = ("--tokenizer", "none", "--model-tokenizer", "known=builtin:mistral-v0.1",
                "--max-body-bytes", str(MAX_BODY), "--server-probe", "off",
                "--body-timeout-seconds", str(BODY_TIMEOUT))  # fmt: skip
        proxy = await asyncio.to_thread(start_proxy, origin.url, log, *args)
        with running(proxy):
            await send_all(proxy.port, origin)
            check_counts(await settled_metrics(proxy.admin_url))
    check_log(log.read_text(errors="replace"), KINDS)


async def test_the_canary_never_reaches_python_logging(captured: list[str]) -> None:
    async with recording_origin() as origin:
        known = {"known": "builtin:mistral-v0.1"}
        config = proxy_config(origin.url, tokenizer="none", model_tokenizers=known, max_body_bytes=MAX_BODY,
                              server_probe="off", body_timeout_seconds=BODY_TIMEOUT)  # fmt: skip
        async with run_proxy(config) as (url, admin_url, _):
            await send_all(int(url.rsplit(":", 1)[1]), origin)
            check_counts(await settled_metrics(admin_url))
    # An upstream that refuses connections, asked for a path and query full of canary.
    dead = proxy_config(f"http://127.0.0.1:{free_port()}", tokenizer="none", server_probe="off")
    async with run_proxy(dead) as (url, _, _):
        for _ in range(3):
            answer = await send(int(url.rsplit(":", 1)[1]), _json(b"/%s?%s=%s" % (C, C, C), _chat()))
            assert answer.startswith(b"HTTP/1.1 502 ")
    check_log("\n".join(captured), (*KINDS, "upstream_connect"))


@pytest.fixture
def captured() -> Iterator[list[str]]:
    """Every log record of this process, DEBUG up, formatted with its traceback."""
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(self.format(record))

    handler = Keep(logging.DEBUG)
    root = logging.getLogger()
    old = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield lines
    finally:
        root.removeHandler(handler)
        root.setLevel(old)
