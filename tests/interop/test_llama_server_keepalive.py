"""llama-server (cpp-httplib) closes the connection after a streamed response although it sent
`Keep-Alive`; a proxy that reuses that pooled connection used to answer the next request with a 502 the
client never sees when talking to llama-server directly. Alternating streamed and non-streamed chats
through the proxy: every one answered, the lost ones sent again and counted."""

from __future__ import annotations

import asyncio
import urllib.request

import aiohttp
import pytest

from interop.proxy_proc import Proxy
from tests.server.helpers import parse_metrics, value

pytestmark = pytest.mark.llama_server
REQUESTS = 500


async def alternate(url: str, n: int) -> list[int]:
    statuses = []
    async with aiohttp.ClientSession() as s:
        for i in range(n):
            body = {
                "model": "m",
                "messages": [{"role": "user", "content": f"Say {i}."}],
                "max_tokens": 1,
                "stream": i % 2 == 0,
            }
            async with s.post(url + "/v1/chat/completions", json=body) as r:
                await r.read()
                statuses.append(r.status)
    return statuses


def test_alternating_streams_never_get_a_proxy_made_error(llama_proxy: Proxy) -> None:
    statuses = asyncio.run(alternate(llama_proxy.base_url, REQUESTS))
    assert statuses == [200] * REQUESTS
    with urllib.request.urlopen(llama_proxy.metrics_url, timeout=10) as r:
        m = parse_metrics(r.read().decode())
    assert value(m, "islwatch_upstream_errors_total", kind="reset") == 0
    assert value(m, "islwatch_upstream_retries_total") >= 1  # llama-server did close reused connections
