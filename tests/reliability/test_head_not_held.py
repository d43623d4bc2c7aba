"""The response head is never held for the body: a raw-socket upstream answers with its head, then waits on
an event before it sends a byte of the body, and a raw-socket client of a real islwatch proxy must hold the
whole head (and whatever body bytes came with it) while the upstream still waits. An SSE stream's first event
can take a model's whole prefill, so a head held for it would add that to the client's time to headers.

When the head and the body come in one upstream write, the client gets them as the upstream sent them, byte
for byte (proxy/server/relay.py writes the two together).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from proxy.server.app import run_proxy
from tests.reliability.test_header_fidelity import DATE, content_length, field_lines, raw_server
from tests.server.helpers import Background, proxy_config

READ_DEADLINE_SECONDS = 30.0  # a guard against a proxy that holds the bytes back, not a timing assertion
BODY = b'{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}'
REQUEST = (
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: proxy\r\nContent-Type: application/json\r\n"
    b"Content-Length: %d\r\n\r\n" % len(BODY)
) + BODY
SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\n" + DATE + b"Server: raw\r\nContent-Type: text/event-stream\r\n"
    b"Cache-Control: no-cache\r\nX-Request-Id: 7\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
)
# No usage-only chunk: a proxy that injected include_usage strips that one (core/usage.py), nothing else.
EVENTS = [
    b'data: {"choices":[{"index":0,"delta":{"content":"first"}}]}\n\n',
    b'data: {"choices":[{"index":0,"delta":{"content":" second"},"finish_reason":"stop"}]}\n\n',
    b"data: [DONE]\n\n",
]
PARTIAL = 20  # bytes of the first event sent with the head in the "partial" case: not a whole line
JSON_BODY = b'{"id":"x","choices":[{"index":0,"message":{"content":"hi"}}],"usage":{"prompt_tokens":7}}'


def chunked(*pieces: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces)


def json_head(length: int) -> bytes:
    return (
        b"HTTP/1.1 200 OK\r\n"
        + DATE
        + b"Server: raw\r\nContent-Type: application/json\r\nX-Request-Id: 7\r\n"
        b"Content-Length: %d\r\nConnection: close\r\n\r\n" % length
    )


@dataclass
class HeldUpstream:
    """Answers each request with `first` (the head, and any body bytes sent with it) in one write, then waits
    for `release` before it writes `rest` and closes."""

    first: bytes = b""
    rest: bytes = b""
    waiting: asyncio.Event = field(default_factory=asyncio.Event)  # `first` is written
    release: asyncio.Event = field(default_factory=asyncio.Event)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            await reader.readexactly(content_length(head))
            writer.write(self.first)
            self.waiting.set()  # before any await: a client holding these bytes finds it set
            await writer.drain()
            await self.release.wait()
            writer.write(self.rest)
            await writer.drain()
        finally:
            writer.close()


@dataclass
class Servers:
    bg: Background
    upstream: HeldUpstream
    proxy_ports: dict[str, int]  # "plain": relays only; "tapped": counts, and injects and strips stream usage

    def arm(self, first: bytes, rest: bytes) -> HeldUpstream:
        """The next answer; fresh events, created in the servers' loop."""

        def fresh() -> None:
            self.upstream.first, self.upstream.rest = first, rest
            self.upstream.waiting, self.upstream.release = asyncio.Event(), asyncio.Event()

        self.bg.call(fresh)
        return self.upstream

    def release(self) -> None:
        self.bg.loop.call_soon_threadsafe(self.upstream.release.set)

    def upstream_waiting(self) -> bool:
        """The upstream wrote its first bytes and has not been released (read in the servers' loop)."""
        return self.bg.call(lambda: self.upstream.waiting.is_set() and not self.upstream.release.is_set())


@pytest.fixture(scope="module")
def servers() -> Iterator[Servers]:
    bg = Background()
    upstream = HeldUpstream()
    try:
        url = bg.enter(raw_server(upstream))  # type: ignore[arg-type]
        plain = bg.enter(run_proxy(proxy_config(url, tokenizer="none")))
        tapped = bg.enter(run_proxy(proxy_config(url, inject_stream_usage=True, server_probe="off")))
        ports = {name: int(p.url.rsplit(":", 1)[1]) for name, p in (("plain", plain), ("tapped", tapped))}
        yield Servers(bg, upstream, ports)
    finally:
        bg.close()


@contextlib.contextmanager
def connect(servers: Servers, proxy: str) -> Iterator[socket.socket]:
    """A client connection with the request sent; the upstream is released on the way out, whatever failed."""
    address = ("127.0.0.1", servers.proxy_ports[proxy])
    try:
        with socket.create_connection(address, timeout=READ_DEADLINE_SECONDS) as s:
            s.sendall(REQUEST)
            yield s
    finally:
        servers.release()


def read_until(s: socket.socket, data: bytes, done: object) -> bytes:
    """Read until `done(data)` holds; a proxy that holds bytes back fails on the socket's deadline."""
    while not done(data):  # type: ignore[operator]
        try:
            chunk = s.recv(65536)
        except TimeoutError:
            raise AssertionError(f"the client still waits for bytes; it holds {data!r}") from None
        assert chunk, f"connection closed early; the client holds {data!r}"
        data += chunk
    return data


def dechunk(data: bytes) -> tuple[bytes, bool]:
    """The payload of a chunked body so far, and whether its last chunk arrived."""
    out, at = b"", 0
    while (end := data.find(b"\r\n", at)) >= 0:
        size = int(data[at:end], 16)
        if size == 0:
            return out, True
        if len(data) < end + 2 + size + 2:
            break
        out += data[end + 2 : end + 2 + size]
        at = end + 2 + size + 2
    return out, False


def relayed_lines(head: bytes, drop: tuple[bytes, ...]) -> list[bytes]:
    """A head's status line and field lines, without the fields named in `drop` (any case)."""
    lines = [head.split(b"\r\n", 1)[0], *field_lines(head)]
    return [line for line in lines if line.split(b":", 1)[0].lower() not in drop]


PROXIES = ["plain", "tapped"]


@pytest.mark.parametrize("proxy", PROXIES)
@pytest.mark.parametrize("sent_with_head", ["nothing", "first-event", "part-of-a-line"])
def test_stream_head_reaches_the_client_while_the_upstream_waits(
    servers: Servers, proxy: str, sent_with_head: str
) -> None:
    whole = b"".join(EVENTS)
    early = {"nothing": b"", "first-event": EVENTS[0], "part-of-a-line": EVENTS[0][:PARTIAL]}[sent_with_head]
    servers.arm(SSE_HEAD + (chunked(early) if early else b""), chunked(whole[len(early) :]) + b"0\r\n\r\n")
    # A whole event is relayed at once; a partial line may be held until its newline (the tapped proxy does).
    wanted = b"" if sent_with_head == "part-of-a-line" else early
    with connect(servers, proxy) as s:
        data = read_until(
            s, b"", lambda d: b"\r\n\r\n" in d and dechunk(d.partition(b"\r\n\r\n")[2])[0].startswith(wanted)
        )
        assert servers.upstream_waiting()  # the whole head (and the first event) came before the rest
        head, _, body = data.partition(b"\r\n\r\n")
        assert early.startswith(dechunk(body)[0])
        hop = (b"transfer-encoding", b"connection")
        assert relayed_lines(head + b"\r\n\r\n", hop) == relayed_lines(SSE_HEAD, hop)
        assert b"Transfer-Encoding: chunked" in field_lines(head + b"\r\n\r\n")
        servers.release()
        body = read_until(s, body, lambda d: dechunk(d)[1])
    assert dechunk(body)[0] == whole


@pytest.mark.parametrize("proxy", PROXIES)
def test_json_head_with_a_length_reaches_the_client_before_its_body(servers: Servers, proxy: str) -> None:
    head = json_head(len(JSON_BODY))
    servers.arm(head, JSON_BODY)
    with connect(servers, proxy) as s:
        data = read_until(s, b"", lambda d: b"\r\n\r\n" in d)
        assert servers.upstream_waiting()
        assert data == head.replace(b"Connection: close\r\n", b"")  # nothing of the body yet
        servers.release()
        data = read_until(
            s, data, lambda d: len(d) == len(head) - len(b"Connection: close\r\n") + len(JSON_BODY)
        )
    assert data.endswith(b"\r\n\r\n" + JSON_BODY)


@pytest.mark.parametrize("proxy", PROXIES)
def test_head_and_body_in_one_upstream_write_reach_the_client_byte_for_byte(
    servers: Servers, proxy: str
) -> None:
    head = json_head(len(JSON_BODY))
    upstream = servers.arm(head + JSON_BODY, b"")
    servers.release()  # nothing is held: the upstream writes its whole answer at once
    expected = head.replace(b"Connection: close\r\n", b"") + JSON_BODY
    with connect(servers, proxy) as s:
        data = read_until(s, b"", lambda d: len(d) >= len(expected))
    assert data == expected
    assert upstream.first == head + JSON_BODY
