"""Slow and idle clients on raw sockets: a request head still arriving after `header_timeout_seconds`
(slowloris, all at once or trickled byte by byte), a body that stops, an idle keep-alive connection, and
connections past `max_connections`. Each is closed by the proxy and counted in
`islwatch_client_connections_cut_total{reason}`, while the connections that behave keep working. The
timeouts are set small here, and every test waits on the socket closing, never on the clock."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp

from proxy.server.app import ProxyURLs, run_proxy
from tests.eventually import eventually_async
from tests.reliability.reliability_peers import Origin, recording_origin
from tests.server.helpers import fetch_metrics, proxy_config, value, wait_metrics

GUARD_SECONDS = 60.0  # bounds a hung read; not a timing assertion
SHORT = 0.3  # the timeout under test
LONG = 600.0  # the timeouts not under test
HALF_HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nX-Slow: "
GET = b"GET /ok HTTP/1.1\r\nHost: x\r\n\r\n"


@asynccontextmanager
async def proxy(**limits: Any) -> AsyncIterator[tuple[ProxyURLs, Origin]]:
    settings = {"header_timeout_seconds": LONG, "body_timeout_seconds": LONG, "idle_timeout_seconds": LONG,
                **limits}  # fmt: skip
    async with recording_origin() as origin:
        config = proxy_config(origin.url, tokenizer="none", server_probe="off", **settings)
        async with run_proxy(config) as urls:
            yield urls, origin


def port_of(urls: ProxyURLs) -> int:
    return int(urls.url.rsplit(":", 1)[1])


async def closed_by_proxy(reader: asyncio.StreamReader) -> bytes:
    """Everything the proxy sends until it closes the connection (EOF)."""
    async with asyncio.timeout(GUARD_SECONDS):
        return await reader.read()


async def response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """One Content-Length framed response (the recording origin's answers, relayed)."""
    async with asyncio.timeout(GUARD_SECONDS):
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:"))  # fmt: skip
        return int(head.split(b" ", 2)[1]), await reader.readexactly(length)


async def metrics(urls: ProxyURLs) -> dict[Any, float]:
    async with aiohttp.ClientSession() as s:
        return await fetch_metrics(s, urls.admin_url)


async def until_metrics(urls: ProxyURLs, check: Any) -> dict[Any, float]:
    async with aiohttp.ClientSession() as s:
        return await wait_metrics(s, urls.admin_url, check)


def cut(m: dict[Any, float], reason: str) -> float:
    return value(m, "islwatch_client_connections_cut_total", reason=reason)


async def test_half_sent_heads_are_closed_after_the_header_timeout() -> None:
    async with proxy(header_timeout_seconds=SHORT) as (urls, origin):
        conns = [await asyncio.open_connection("127.0.0.1", port_of(urls)) for _ in range(20)]
        for _, writer in conns:
            writer.write(HALF_HEAD)
            await writer.drain()
        for reader, writer in conns:
            assert await closed_by_proxy(reader) == b""  # closed without an answer
            writer.close()
        m = await metrics(urls)
        assert cut(m, "header_timeout") == 20
        assert origin.requests == []  # nothing half-sent went upstream
        # The proxy serves the next client as before.
        reader, writer = await asyncio.open_connection("127.0.0.1", port_of(urls))
        writer.write(GET)
        assert (await response(reader))[0] == 200
        writer.close()


async def test_a_head_trickled_byte_by_byte_is_closed_too() -> None:
    """The deadline runs from the head's first byte: bytes that keep coming do not extend it (an inactivity
    timer would never fire here). Short field lines, so no size limit of the parser ends it instead."""
    async with proxy(header_timeout_seconds=SHORT) as (urls, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", port_of(urls))
        writer.write(b"GET / HTTP/1.1\r\n")
        trickle = b"".join(b"X-%d: y\r\n" % i for i in range(100))
        sent = 0
        for byte in trickle:  # the attack's pace, one byte at a time: pacing, not a wait on a state
            if reader.at_eof() or writer.is_closing():
                break
            writer.write(bytes([byte]))
            sent += 1
            await asyncio.sleep(SHORT / 20)
        assert await closed_by_proxy(reader) == b""  # no 400: the deadline closed it, not a parser limit
        # Cut while the head was still arriving: a timer reset by each byte would only fire after the last.
        assert sent < len(trickle)
        writer.close()
        assert cut(await metrics(urls), "header_timeout") == 1


async def test_an_answer_slower_than_the_header_timeout_is_not_cut() -> None:
    """The head deadline stops once the head is complete (the handler tells the connection's guard): an
    upstream answer that takes longer than `header_timeout_seconds` still reaches the client. The wait is on
    an event: a head left half-sent after this request's head is closed first, so this request's deadline
    would have passed too before the origin answers."""
    async with proxy(header_timeout_seconds=SHORT) as (urls, origin):
        origin.hold = True
        reader, writer = await asyncio.open_connection("127.0.0.1", port_of(urls))
        writer.write(GET)
        await eventually_async(lambda: len(origin.held), until=lambda n: n == 1, what="the origin holding it")
        late_reader, late_writer = await asyncio.open_connection("127.0.0.1", port_of(urls))
        late_writer.write(HALF_HEAD)
        assert await closed_by_proxy(late_reader) == b""  # its deadline passed
        late_writer.close()
        origin.release()
        assert (await response(reader))[0] == 200
        writer.close()
        assert cut(await metrics(urls), "header_timeout") == 1  # the half-sent head only


async def test_a_body_that_stops_is_closed_after_the_body_timeout() -> None:
    """On an analysed endpoint (the proxy reads the body first) and on a relayed path (the body streams
    upstream as it arrives); neither is counted as the upstream's failure."""
    async with proxy(body_timeout_seconds=SHORT) as (urls, origin):
        for path in (b"/v1/chat/completions", b"/upload"):
            reader, writer = await asyncio.open_connection("127.0.0.1", port_of(urls))
            writer.write(b'POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"model":' % path)
            await writer.drain()
            assert await closed_by_proxy(reader) == b""
            writer.close()
        m = await until_metrics(urls, lambda m: cut(m, "body_timeout") == 2)
        assert value(m, "islwatch_upstream_errors_total") == 0
        assert [seen.target for seen in origin.requests] == []  # no partial body became a request
        # A body that arrives whole, in pieces, is relayed.
        reader, writer = await asyncio.open_connection("127.0.0.1", port_of(urls))
        writer.write(b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nab")
        await writer.drain()
        writer.write(b"cd")
        assert (await response(reader))[0] == 200
        writer.close()
        assert origin.requests[-1].body == b"abcd"


async def test_an_idle_keep_alive_connection_is_closed_after_the_idle_timeout() -> None:
    async with proxy(idle_timeout_seconds=SHORT) as (urls, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", port_of(urls))
        writer.write(GET)
        assert (await response(reader))[0] == 200  # kept alive (HTTP/1.1), then idle
        assert await closed_by_proxy(reader) == b""
        writer.close()
        silent, silent_writer = await asyncio.open_connection("127.0.0.1", port_of(urls))
        assert await closed_by_proxy(silent) == b""  # one that never sends a byte goes the same way
        silent_writer.close()
        m = await metrics(urls)
        assert value(m, "islwatch_client_connections_cut_total") == 0  # idle is not a cut: nothing was lost
        assert value(m, "islwatch_client_connections") == 0


async def test_connections_past_the_cap_are_closed_when_every_one_is_in_a_request() -> None:
    """At the cap with every connection inside a request (the origin holds them), a new connection is
    closed when accepted: nothing waits for a head that could make room."""
    cap = 4
    async with proxy(max_connections=cap) as (urls, origin):
        origin.hold = True
        conns = [await asyncio.open_connection("127.0.0.1", port_of(urls)) for _ in range(cap)]
        for _, writer in conns:
            writer.write(GET)
        await eventually_async(lambda: len(origin.held), until=lambda n: n == cap, what="all held upstream")
        extra, extra_writer = await asyncio.open_connection("127.0.0.1", port_of(urls))  # accepted, closed
        extra_writer.write(GET)
        assert await closed_by_proxy(extra) == b""
        extra_writer.close()
        m = await metrics(urls)
        assert cut(m, "connection_cap") == 1 and cut(m, "evicted") == 0
        assert value(m, "islwatch_client_connections") == cap
        origin.release()
        for reader, writer in conns:  # the connections inside a request are answered, and serve again
            assert (await response(reader))[0] == 200
            writer.write(GET)
            assert (await response(reader))[0] == 200
        for _, writer in conns:
            writer.close()
        await eventually_async(
            lambda: metrics(urls),
            until=lambda m: value(m, "islwatch_client_connections") == 0,
            what="every connection closed",
        )


async def test_at_the_cap_the_connection_waiting_longest_for_a_head_makes_room() -> None:
    """Connections that sent nothing, part of a head, or sit idle after a request are closed oldest first
    to admit new ones; the connection inside a request is never chosen."""
    cap = 4
    async with proxy(max_connections=cap) as (urls, origin):
        busy_reader, busy_writer = await asyncio.open_connection("127.0.0.1", port_of(urls))
        busy_writer.write(GET)
        assert (await response(busy_reader))[0] == 200  # now idle after a request: the newest waiting
        origin.hold = True
        busy_writer.write(GET)  # inside a request from here on
        await eventually_async(lambda: len(origin.held), until=lambda n: n == 1, what="held upstream")
        silent = await asyncio.open_connection("127.0.0.1", port_of(urls))
        half = await asyncio.open_connection("127.0.0.1", port_of(urls))
        half[1].write(HALF_HEAD)
        third = await asyncio.open_connection("127.0.0.1", port_of(urls))
        await until_metrics(urls, lambda m: value(m, "islwatch_client_connections") == cap)
        origin.release()
        clients = []
        for oldest in (silent, half):  # each new client evicts the longest-waiting one
            reader, writer = await asyncio.open_connection("127.0.0.1", port_of(urls))
            clients.append((reader, writer))  # kept open: the proxy stays at its cap
            writer.write(GET)
            assert await closed_by_proxy(oldest[0]) == b""
            assert (await response(reader))[0] == 200
        assert (await response(busy_reader))[0] == 200  # the request in flight went on
        assert cut(await metrics(urls), "evicted") == 2
        assert cut(await metrics(urls), "connection_cap") == 0
        for _, writer in (silent, half, third, (busy_reader, busy_writer), *clients):
            writer.close()


async def test_a_connection_idle_after_its_request_waits_for_a_head_too() -> None:
    """A kept-alive connection idle after its answer waits for a head from the end of that request: it is
    evicted before a half-sent head that began after it, and the new client is answered."""
    async with proxy(max_connections=2) as (urls, _):
        idle_reader, idle_writer = await asyncio.open_connection("127.0.0.1", port_of(urls))
        idle_writer.write(GET)
        assert (await response(idle_reader))[0] == 200  # idle from here: the longest waiting
        half_reader, half_writer = await asyncio.open_connection("127.0.0.1", port_of(urls))
        half_writer.write(HALF_HEAD)
        await until_metrics(urls, lambda m: value(m, "islwatch_client_connections") == 2)
        reader, writer = await asyncio.open_connection("127.0.0.1", port_of(urls))
        writer.write(GET)
        assert await closed_by_proxy(idle_reader) == b""
        assert (await response(reader))[0] == 200
        assert not half_reader.at_eof()  # still open: the proxy stays at its cap with it
        m = await metrics(urls)
        assert cut(m, "evicted") == 1 and cut(m, "connection_cap") == 0
        for w in (idle_writer, half_writer, writer):
            w.close()


async def test_a_connection_that_sends_nothing_is_closed_after_the_header_timeout() -> None:
    """The first head's deadline runs from the accept: a socket that never sends a byte does not wait for
    the idle timeout."""
    async with proxy(header_timeout_seconds=SHORT) as (urls, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", port_of(urls))
        assert await closed_by_proxy(reader) == b""
        writer.close()
        assert cut(await metrics(urls), "header_timeout") == 1


async def test_each_head_on_a_kept_alive_connection_gets_its_own_deadline() -> None:
    """One deadline timer per connection, checked when it fires (guard._head_check): requests that complete
    in time are never cut, and a later head left half-sent is cut at its own deadline, not the first's."""
    async with proxy(header_timeout_seconds=SHORT) as (urls, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", port_of(urls))
        for _ in range(20):
            writer.write(GET)
            assert (await response(reader))[0] == 200
        writer.write(HALF_HEAD)
        assert await closed_by_proxy(reader) == b""
        writer.close()
        assert cut(await metrics(urls), "header_timeout") == 1
