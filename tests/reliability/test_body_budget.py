"""Memory has a global bound: a burst of maximum-size request bodies (64 clients at once, 8 MiB each: 512
MiB declared, ~1.5 GB at the ~3x a held body peaks at) through a real `islwatch proxy` with
`--max-inflight-body-bytes 64 MiB` keeps the proxy's peak RSS (VmHWM) within a 512 MiB container limit. The
requests past the budget wait for room; any still waiting after budget.WAIT_SECONDS get a 503 with
Retry-After; both are counted, and every request is answered. The origin reads each body whole and answers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import orjson
import pytest

from tests.reliability.reliability_peers import running, start_proxy
from tests.server.helpers import fetch_metrics, value

MiB = 1024 * 1024
BODY_BYTES = 8 * MiB  # the default --max-body-bytes
CLIENTS = 64
BUDGET = 64 * MiB
CONTAINER_LIMIT = 512 * MiB
GUARD_SECONDS = 120.0  # bounds a hung request; not a timing assertion


@asynccontextmanager
async def sink_origin() -> AsyncIterator[str]:
    """Reads each request's Content-Length body whole (dropping it as it comes) and answers a small JSON."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while head := await reader.readuntil(b"\r\n\r\n"):
                length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length:"))  # fmt: skip
                while length:
                    length -= len(await reader.read(min(length, 1 << 20)))
                answer = b'{"id":"x","object":"chat.completion","choices":[]}'
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                             % (len(answer), answer))  # fmt: skip
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()


def peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def max_size_body() -> bytes:
    frame = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": ""}]})
    pad = BODY_BYTES - len(frame)
    return frame.replace(b'"content":""', b'"content":"' + b"a" * pad + b'"')


@pytest.mark.slow  # 64 bodies of 8 MiB through a proxy process
async def test_a_burst_of_max_size_bodies_stays_within_the_memory_limit(tmp_path: Path) -> None:
    body = max_size_body()
    assert len(body) == BODY_BYTES
    async with sink_origin() as origin:
        proxy = start_proxy(origin, tmp_path / "proxy.log", "--tokenizer", "none", "--server-probe", "off",
                            "--max-inflight-body-bytes", str(BUDGET))  # fmt: skip
        with running(proxy):
            url = proxy.url + "/v1/chat/completions"
            headers = {"Content-Type": "application/json"}
            connector = aiohttp.TCPConnector(limit=CLIENTS, force_close=True)
            async with aiohttp.ClientSession(connector=connector) as s:

                async def post() -> tuple[int, str | None]:
                    async with (
                        asyncio.timeout(GUARD_SECONDS),
                        s.post(url, data=body, headers=headers) as resp,
                    ):
                        await resp.read()
                        return resp.status, resp.headers.get("Retry-After")

                got = await asyncio.gather(*(post() for _ in range(CLIENTS)))
                m = await fetch_metrics(s, proxy.admin_url)
            peak = peak_rss(proxy.proc.pid)
    assert peak < CONTAINER_LIMIT, f"peak RSS {peak / MiB:.0f} MiB"
    assert all(g == (200, None) or g == (503, "1") for g in got), got
    answered = sum(1 for status, _ in got if status == 200)
    assert answered >= BUDGET // BODY_BYTES
    assert value(m, "islwatch_body_budget_total", event="waited") > 0  # the budget was reached
    assert value(m, "islwatch_body_budget_total", event="refused") == CLIENTS - answered
    assert value(m, "islwatch_inflight_body_bytes") == 0  # every share given back
