"""Upstream response heads as large as a server may send cross the proxy: a 9 KB field and 200 fields (past
aiohttp's client defaults, 8,190 bytes and 128 fields, which curl and httpx accept) reach the client byte for
byte. A head past the configured limits is the proxy's 502 with its own reason,
`islwatch_upstream_errors_total{kind="head_too_large"}`. A raw-socket upstream writes the heads; a raw-socket
client reads what the proxy relays."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import orjson
import pytest

from proxy.server.app import run_proxy
from tests.reliability.reliability_peers import Origin, Response, exchange, recording_origin
from tests.server.helpers import fetch_metrics, proxy_config, value

GET = b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"
BODY = b'{"object":"list","data":[]}'


def answer(fields: list[bytes]) -> bytes:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n" % len(BODY)
    return head + b"".join(f + b"\r\n" for f in fields) + b"\r\n" + BODY


@asynccontextmanager
async def proxied(**settings: Any) -> AsyncIterator[tuple[int, str, Origin]]:
    async with recording_origin() as origin:
        config = proxy_config(origin.url, tokenizer="none", server_probe="off", **settings)
        async with run_proxy(config) as urls:
            yield int(urls.url.rsplit(":", 1)[1]), urls.admin_url, origin


async def one(port: int, origin: Origin, reply: bytes) -> Response:
    origin.replies.append(reply)
    got = await exchange(port, GET, sentinel=False)
    assert len(got.responses) == 1
    return got.responses[0]


async def test_a_9kb_field_and_200_fields_reach_the_client() -> None:
    big = b"X-Trace: " + b"a" * 9 * 1024
    many = [b"X-F%d: v%d" % (i, i) for i in range(200)]
    async with proxied() as (port, _, origin):
        relayed = await one(port, origin, answer([big]))
        assert relayed.status == 200 and relayed.body == BODY
        assert relayed.header(b"x-trace") == [b"a" * 9 * 1024]
        relayed = await one(port, origin, answer(many))
        assert relayed.status == 200 and relayed.body == BODY
        assert [(k, v) for k, v in relayed.headers if k.startswith(b"X-F")] == [
            tuple(f.split(b": ")) for f in many
        ]


async def test_a_head_past_the_limits_is_a_502_with_its_own_reason(caplog: pytest.LogCaptureFixture) -> None:
    async with proxied(upstream_max_field_bytes=4096, upstream_max_header_fields=50) as (port, admin, origin):
        too_long = await one(port, origin, answer([b"X-Trace: " + b"a" * 5000]))
        # Logged once, by the handler, under its own reason: not again by aiohttp's server log.
        said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(said) == 1 and said[0].startswith("upstream_head_too_large:"), said
        too_many = await one(port, origin, answer([b"X-F%d: v" % i for i in range(60)]))
        for relayed in (too_long, too_many):
            assert relayed.status == 502
            assert orjson.loads(relayed.body)["error"]["code"] == "head_too_large"
        within = await one(port, origin, answer([b"X-Trace: " + b"a" * 4000]))
        assert within.status == 200
        async with aiohttp.ClientSession() as s:
            m = await fetch_metrics(s, admin)
        assert value(m, "islwatch_upstream_errors_total", kind="head_too_large") == 2
        assert value(m, "islwatch_upstream_errors_total", kind="reset") == 0
