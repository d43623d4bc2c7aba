"""A slowloris does not starve real clients: 2,000 raw sockets that hold idle, hold half a head, or trickle
a header line now and then fill the connection cap, and six normal requests sent while they hold are all
answered. At the cap the connection that has waited longest for a head is closed to admit the new one
(`islwatch_client_connections_cut_total{reason="evicted"}`). The head and idle timeouts are set long here:
only the cap's choice is under test (test_timeouts.py tests the deadlines)."""

from __future__ import annotations

import asyncio
import contextlib
import resource

import aiohttp
import pytest

from proxy.server.app import run_proxy
from tests.reliability.reliability_peers import recording_origin
from tests.server.helpers import fetch_metrics, proxy_config, value

SLOW = 2000
CAP = 1024
LONG = 600.0
HALF_HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
GUARD_SECONDS = 60.0  # bounds a hung request; not a timing assertion


@pytest.fixture(autouse=True)
def enough_fds() -> None:
    """Both ends of every socket live in this process: about 2 x 2,000 descriptors."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 2 * SLOW + 512
    if hard != resource.RLIM_INFINITY and hard < wanted:
        pytest.skip(f"open-file limit {hard} < {wanted}")
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


async def trickle(writers: list[asyncio.StreamWriter], stop: asyncio.Event) -> None:
    """A header line on each trickling socket, then a pause: the attack's pace, not a wait on a state."""
    n = 0
    while not stop.is_set():
        for writer in writers:
            if not writer.is_closing():
                writer.write(b"X-Slow-%d: y\r\n" % n)
        n += 1
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.5)


async def test_normal_requests_are_answered_while_2000_slow_sockets_hold() -> None:
    async with recording_origin() as origin:
        config = proxy_config(
            origin.url, tokenizer="none", server_probe="off", max_connections=CAP,
            header_timeout_seconds=LONG, idle_timeout_seconds=LONG, body_timeout_seconds=LONG,
        )  # fmt: skip
        async with run_proxy(config) as urls:
            port = int(urls.url.rsplit(":", 1)[1])
            slow: list[asyncio.StreamWriter] = []
            stop = asyncio.Event()
            trickling: asyncio.Task[None] | None = None
            try:
                for i in range(SLOW):  # a third silent, a third half a head, a third trickling lines
                    _, writer = await asyncio.open_connection("127.0.0.1", port)
                    if i % 3:
                        writer.write(HALF_HEAD)
                    slow.append(writer)
                trickling = asyncio.create_task(trickle(slow[2::3], stop))
                statuses = []
                async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s:
                    for i in range(6):
                        async with asyncio.timeout(GUARD_SECONDS):
                            async with s.get(f"{urls.url}/normal/{i}") as resp:
                                await resp.read()
                                statuses.append(resp.status)
                    m = await fetch_metrics(s, urls.admin_url)
                assert statuses == [200] * 6
                assert [r.target for r in origin.requests] == [f"/normal/{i}" for i in range(6)]
                assert value(m, "islwatch_client_connections_cut_total", reason="evicted") >= SLOW - CAP
                assert value(m, "islwatch_client_connections_cut_total", reason="connection_cap") == 0
            finally:
                stop.set()
                if trickling is not None:
                    await trickling
                for writer in slow:
                    writer.close()
