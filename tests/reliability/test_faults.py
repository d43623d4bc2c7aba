"""Faults, with the proxy as a process (`islwatch proxy`) in front of an `islwatch emulate` process: clients
that go away mid-request and mid-stream (counted, the upstream connection released), the upstream killed
and restarted (during the outage the client gets the proxy's 502, where a direct client's connection is
refused; afterwards traffic flows and /readyz says so), and resets mid-stream (an in-process emulator with
the `reset-mid-stream` fault: the client gets the same bytes and the same truncation as a direct client).
Each wait is on an event (eventually), never a sleep.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from proxy.emulator.app import EmulatorConfig, build_emulator_app
from proxy.emulator.faults import parse_faults
from proxy.server.app import run_proxy
from tests.conftest import load_builtin
from tests.eventually import eventually
from tests.reliability.reliability_peers import (
    Child,
    free_port,
    recording_origin,
    running,
    start_emulator,
    start_proxy,
    stop,
    tcp_peers,
)
from tests.server.helpers import Background, parse_metrics, proxy_config, serve_app, value

CHAT = {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]}
# An answer far longer than any socket buffer: the emulator is still writing when the client leaves.
ENDLESS = {**CHAT, "max_tokens": 500_000, "stream": True}


@dataclass
class Peers:
    emulator: Child
    proxy: Child
    logs: Path

    def metrics(self) -> dict[Any, float]:
        return scrape(self.proxy.admin_url)

    def emulator_stats(self) -> dict[str, int]:
        with urllib.request.urlopen(self.emulator.url + "/emulator/stats", timeout=10) as r:
            return dict(orjson.loads(r.read()))

    def upstream_conns(self) -> int:
        return tcp_peers(self.proxy.proc.pid, self.emulator.port)


def scrape(admin_url: str) -> dict[Any, float]:
    with urllib.request.urlopen(admin_url + "/metrics", timeout=10) as r:
        return parse_metrics(r.read().decode())


def readyz(p: Peers) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(p.proxy.admin_url + "/readyz", timeout=10) as r:
            return r.status, orjson.loads(r.read())
    except urllib.error.HTTPError as err:
        return err.code, orjson.loads(err.read())


@pytest.fixture(scope="module")
def peers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Peers]:
    logs = tmp_path_factory.mktemp("faults")
    emulator = start_emulator(logs / "emulate.log", free_port())
    p = None
    try:
        args = ("--upstream-health-path", "/health")
        with running(start_proxy(emulator.url, logs / "proxy.log", *args)) as proxy:
            p = Peers(emulator, proxy, logs)
            yield p
    finally:
        stop(p.emulator if p is not None else emulator)  # the tests restart it


def disconnects(m: dict[Any, float]) -> str:
    return repr({k: v for k, v in m.items() if "disconnect" in k[0] or "match_total" in k[0]})


async def post(base: str, body: dict[str, Any]) -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as s, s.post(base + "/v1/chat/completions", json=body) as r:
        return r.status, await r.read()


def test_client_gone_mid_request_body_never_reaches_the_upstream_and_is_counted(peers: Peers) -> None:
    before, requests = peers.metrics(), peers.emulator_stats()["requests"]
    with socket.create_connection(("127.0.0.1", peers.proxy.port)) as s:
        s.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100000\r\n\r\n" + b'{"model": "m", "messages": ['
        )  # and the client goes away with 99,972 bytes unsent
    m = eventually(
        peers.metrics,
        until=lambda m: (
            value(m, "islwatch_client_disconnects_total", stage="request")
            > value(before, "islwatch_client_disconnects_total", stage="request")
        ),
        what="the proxy counting the client gone mid-request",
        describe=disconnects,
    )
    assert value(m, "islwatch_upstream_errors_total") == value(before, "islwatch_upstream_errors_total")
    assert peers.emulator_stats()["requests"] == requests  # nothing half-sent went upstream
    assert asyncio.run(post(peers.proxy.url, CHAT))[0] == 200  # and the proxy serves on


def test_client_gone_mid_stream_releases_the_upstream_and_is_counted(peers: Peers) -> None:
    before, stats, pooled = peers.metrics(), peers.emulator_stats(), peers.upstream_conns()

    async def leave_after_first_chunk() -> None:
        async with aiohttp.ClientSession() as s:
            r = await s.post(peers.proxy.url + "/v1/chat/completions", json=ENDLESS)
            assert r.status == 200 and (await r.content.readuntil(b"\n\n")).startswith(b"data: ")
            r.close()  # the client goes away mid-stream

    asyncio.run(leave_after_first_chunk())
    # The proxy closed its upstream request: the emulator sees its client go (and stops generating).
    eventually(peers.emulator_stats, until=lambda s: s["client_disconnects"] > stats["client_disconnects"],
               what="the emulator seeing the proxy close the stream")  # fmt: skip
    m = eventually(
        peers.metrics,
        until=lambda m: (
            value(m, "islwatch_client_disconnects_total", stage="response")
            > value(before, "islwatch_client_disconnects_total", stage="response")
            and value(m, "islwatch_isl_match_total", result="no_server_count")
            > value(before, "islwatch_isl_match_total", result="no_server_count")
        ),
        what="the disconnect counted and the unfinished answer analysed",
        describe=disconnects,
    )
    assert value(m, "islwatch_upstream_errors_total") == value(before, "islwatch_upstream_errors_total")
    assert peers.emulator_stats()["streams_completed"] == stats["streams_completed"]
    # Its upstream connection is closed, not pooled or left open; the next answer is whole.
    eventually(
        peers.upstream_conns, until=lambda n: n <= pooled, what="the stream's upstream connection closed"
    )
    status, body = asyncio.run(post(peers.proxy.url, CHAT))
    assert status == 200 and orjson.loads(body)["usage"]["completion_tokens"] == 2


def test_client_gone_while_the_answer_is_awaited_closes_the_upstream_request_and_is_counted() -> None:
    """The upstream has the request and has not answered yet (an origin that holds it) when the client
    leaves: the proxy closes its upstream connection at once and counts `stage="upstream"`."""
    bg = Background()
    try:
        origin = bg.enter(recording_origin())
        proxy = bg.enter(run_proxy(proxy_config(origin.url, tokenizer="none", server_probe="off")))
        origin.hold = True
        with socket.create_connection(("127.0.0.1", int(proxy.url.rsplit(":", 1)[1]))) as s:
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
            eventually(lambda: len(origin.requests), until=lambda n: n == 1, what="the origin holding it")
        eventually(lambda: origin.closed_by_peer, until=lambda n: n == 1, what="the upstream request closed")
        m = eventually(
            lambda: scrape(proxy.admin_url),
            until=lambda m: value(m, "islwatch_client_disconnects_total", stage="upstream") == 1,
            what="the disconnect counted",
            describe=disconnects,
        )
        assert value(m, "islwatch_upstream_errors_total") == 0  # the client left: not the upstream's fault
    finally:
        bg.close()


async def failure_of(base: str) -> str:
    """How a chat request to `base` ends: `status N` (and the error code of a 5xx) or the client
    exception's class."""
    try:
        status, body = await post(base, CHAT)
    except aiohttp.ClientError as exc:
        return type(exc).__name__
    return f"status {status}" + (" " + orjson.loads(body)["error"]["code"] if status >= 500 else "")


async def streams_cut_by_a_kill(p: Peers) -> list[str]:
    """A direct stream and one through the proxy, both flowing when the emulator is SIGKILLed: how each
    ends (`ended`, or the client exception's class)."""

    async def rest(r: aiohttp.ClientResponse) -> str:
        try:
            while await r.content.readany():
                pass
        except aiohttp.ClientPayloadError as exc:
            return type(exc).__name__
        return "ended"

    async with aiohttp.ClientSession() as s:
        streams = [
            await s.post(base + "/v1/chat/completions", json=ENDLESS)
            for base in (p.emulator.url, p.proxy.url)
        ]
        for r in streams:
            assert r.status == 200 and (await r.content.readuntil(b"\n\n")).startswith(b"data: ")
        stop(p.emulator, signal.SIGKILL)
        return [await rest(r) for r in streams]


@pytest.mark.slow  # an upstream process killed and restarted
def test_upstream_killed_mid_stream_and_restarted(peers: Peers) -> None:
    proxy, port = peers.proxy, peers.emulator.port
    before = peers.metrics()
    assert asyncio.run(failure_of(proxy.url)) == "status 200" and readyz(peers)[0] == 200
    # Streams flowing when it dies end cut, through the proxy as directly; never as a well-ended answer.
    assert asyncio.run(streams_cut_by_a_kill(peers)) == ["ClientPayloadError"] * 2
    # During the outage: a direct client's connection is refused; the proxy answers 502 `connect`.
    assert asyncio.run(failure_of(peers.emulator.url)) == "ClientConnectorError"
    assert [asyncio.run(failure_of(proxy.url)) for _ in range(3)] == ["status 502 connect"] * 3
    status, body = readyz(peers)
    assert status == 503 and body["status"] == "upstream_not_ready", body
    m = peers.metrics()
    for kind, n in (("reset", 1), ("connect", 3)):
        grew = value(m, "islwatch_upstream_errors_total", kind=kind) - value(
            before, "islwatch_upstream_errors_total", kind=kind
        )
        assert grew == n, (kind, grew)
    # Restarted on the same port: /readyz says so, and no request meets a connection of the dead server.
    peers.emulator = start_emulator(peers.logs / "emulate.log", port)
    eventually(lambda: readyz(peers)[0], until=lambda s: s == 200, what="/readyz ready again")
    assert [asyncio.run(failure_of(proxy.url)) for _ in range(20)] == ["status 200"] * 20
    after = peers.metrics()
    assert value(after, "islwatch_upstream_errors_total") == value(m, "islwatch_upstream_errors_total")


@pytest.fixture(scope="module")
def resetting() -> Iterator[tuple[str, str, str]]:
    """An emulator whose every stream is cut after a few chunks, and a proxy (no analysis) in front, both
    in-process: (emulator URL, proxy URL, proxy admin URL)."""
    bg = Background()
    try:
        app = build_emulator_app(EmulatorConfig(faults=parse_faults(["reset-mid-stream"])), load_builtin())
        emu = bg.enter(serve_app(app))
        proxy = bg.enter(run_proxy(proxy_config(emu, tokenizer="none", server_probe="off")))
        yield emu, proxy.url, proxy.admin_url
    finally:
        bg.close()


def test_reset_mid_stream_reaches_the_client_as_the_same_failure(resetting: tuple[str, str, str]) -> None:
    emu, proxy, admin = resetting

    async def read(base: str) -> tuple[bytes, str]:
        got = b""
        async with aiohttp.ClientSession() as s:
            r = await s.post(base + "/v1/chat/completions", json={**CHAT, "max_tokens": 8, "stream": True})
            try:
                async for chunk in r.content.iter_any():
                    got += chunk
            except aiohttp.ClientPayloadError as exc:
                return got, type(exc).__name__
        return got, "ended"

    direct, proxied = asyncio.run(read(emu)), asyncio.run(read(proxy))
    assert direct[1] == proxied[1] == "ClientPayloadError"
    # The same bytes up to the cut (a reader loses what it had not read when the reset arrives, direct or
    # not: so one may hold a few more chunks than the other, never different ones).
    shorter, longer = sorted((direct[0], proxied[0]), key=len)
    assert longer.startswith(shorter) and shorter.startswith(b"data: "), (direct, proxied)
    assert value(scrape(admin), "islwatch_upstream_errors_total", kind="reset") == 1
    # The next request is served whole (a non-streamed answer is never cut by this fault).
    status, body = asyncio.run(post(proxy, CHAT))
    assert status == 200 and orjson.loads(body)["usage"]["completion_tokens"] == 2
