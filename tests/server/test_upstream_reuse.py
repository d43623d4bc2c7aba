"""A server that closes a kept-alive connection as the proxy reuses it (llama-server after a stream; any
server whose keep-alive ends first) must not cost the client a 502 it would not have seen directly: the
request, which never reached the server, is sent once more on a new connection, and counted."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
from prometheus_client import CollectorRegistry

from proxy.server.app import run_proxy
from tests.server.helpers import fetch_metrics, proxy_config, value

ANSWER = b'{"id":"x","object":"chat.completion","choices":[],"usage":{"prompt_tokens":3}}'


class DropsSecondRequest(asyncio.Protocol):
    """Answers the first request of each connection (HTTP/1.1, keep-alive), then closes the connection
    without answering when a second request arrives on it: the request is lost, not applied."""

    def __init__(self, stats: dict[str, int]) -> None:
        self.stats = stats
        self.buffer = b""
        self.answered = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.stats["connections"] += 1

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        head, sep, rest = self.buffer.partition(b"\r\n\r\n")
        if not sep:
            return
        length = next(
            (
                int(line.split(b":", 1)[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            ),
            0,
        )
        if len(rest) < length:
            return
        self.buffer = rest[length:]
        if self.answered == 1:
            self.stats["dropped"] += 1
            self.transport.close()
            return
        self.answered += 1
        self.stats["answered"] += 1
        self.transport.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nKeep-Alive: timeout=30\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(ANSWER), ANSWER)
        )


@asynccontextmanager
async def dropping_upstream(stats: dict[str, int]) -> AsyncIterator[str]:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: DropsSecondRequest(stats), "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        await server.wait_closed()


async def test_requests_lost_on_a_reused_connection_are_sent_again() -> None:
    stats = {"connections": 0, "answered": 0, "dropped": 0}
    async with dropping_upstream(stats) as up:
        cfg = proxy_config(up, tokenizer="none", server_probe="off")
        async with run_proxy(cfg, CollectorRegistry()) as (url, admin_url, _), aiohttp.ClientSession() as s:
            for _ in range(20):  # sequential: each request after the first reuses the pooled connection
                async with s.post(url + "/v1/chat/completions", json={"messages": []}) as r:
                    assert r.status == 200
                    assert await r.read() == ANSWER
            m = await fetch_metrics(s, admin_url)
    assert stats["answered"] == 20  # every request reached the server exactly once
    assert stats["dropped"] >= 1  # the failure did happen, on reused connections
    assert value(m, "islwatch_upstream_retries_total") == stats["dropped"]
    assert value(m, "islwatch_upstream_errors_total", kind="reset") == 0
    assert value(m, "islwatch_requests_total", status_class="2xx") == 20


async def test_a_request_lost_on_a_fresh_connection_is_not_retried() -> None:
    """On a new connection a disconnect may mean the server took the request: not sent again (502)."""

    class DropsFirst(DropsSecondRequest):
        def data_received(self, data: bytes) -> None:
            self.stats["dropped"] += 1
            self.transport.close()

    stats = {"connections": 0, "answered": 0, "dropped": 0}
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: DropsFirst(stats), "127.0.0.1", 0)
    up = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        cfg = proxy_config(up, tokenizer="none", server_probe="off")
        async with run_proxy(cfg, CollectorRegistry()) as (url, admin_url, _), aiohttp.ClientSession() as s:
            async with s.post(url + "/v1/chat/completions", json={"messages": []}) as r:
                assert r.status == 502
            m = await fetch_metrics(s, admin_url)
    finally:
        server.close()
        await server.wait_closed()
    assert stats["dropped"] == 1
    assert value(m, "islwatch_upstream_retries_total") == 0
    assert value(m, "islwatch_upstream_errors_total", kind="reset") == 1
