"""What the reliability tests share: islwatch's emulator and proxy as real processes (the CLI operators run),
a strict raw-socket origin that records every byte it receives, a raw-socket client that reads responses
as they are framed, and /proc readings of a process (RSS, open fds).

Plain asyncio and subprocess: nothing here knows the proxy's internals.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from proxy.runtime import children
from proxy.runtime.children import free_port
from tests.eventually import eventually

START_DEADLINE_SECONDS = 120.0  # a guard against a hung start, not a timing assertion
READ_DEADLINE_SECONDS = 30.0  # a guard against a hung raw read, not a timing assertion
SENTINEL = b"GET /sentinel HTTP/1.1\r\nHost: sentinel\r\n\r\n"


# ---- islwatch processes (spawned by proxy/runtime/children.py) ------------------------------------------------


@dataclass
class Child:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path
    admin_port: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]


def spawn(args: list[str], log: Path, port: int, admin_port: int = 0) -> Child:
    """`islwatch ARGS...`, its output appended to `log` (a restarted emulator keeps one log). Some tests
    start children from a worker thread (asyncio.to_thread): they must not die with that thread."""
    return Child(children.spawn(args, log, append=True, die_with_parent=False).proc, port, log, admin_port)


def wait_answering(child: Child, url: str) -> None:
    """Until `url` answers 200; fails at once (with the log) if the child exits first."""
    seen = eventually(
        lambda: (child.proc.poll(), children.status(url)),
        until=lambda s: s[0] is not None or s[1] == 200,
        timeout=START_DEADLINE_SECONDS,
        what=f"{url} answering 200",
        interval=0.05,
    )
    assert seen[0] is None, f"exited with {seen[0]}:\n{child.log_tail()}"


def start_emulator(log: Path, port: int = 0, *args: str) -> Child:
    port = port or free_port()
    child = spawn(["emulate", "--listen", f"127.0.0.1:{port}", *args], log, port)
    wait_answering(child, child.url + "/health")
    return child


def start_proxy(upstream: str, log: Path, *args: str) -> Child:
    port, admin = free_port(), free_port()
    cmd = ["proxy", "--upstream", upstream, "--listen", f"127.0.0.1:{port}", "--admin", f"127.0.0.1:{admin}"]
    child = spawn([*cmd, *args], log, port, admin)
    wait_answering(child, child.admin_url + "/readyz")
    return child


def stop(child: Child, sig: int = signal.SIGTERM) -> None:
    children.stop(child.proc, sig, timeout=30)


@contextmanager
def running(child: Child) -> Iterator[Child]:
    try:
        yield child
    finally:
        stop(child)


# ---- /proc ---------------------------------------------------------------------------------------------------


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _readlink(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:  # closed since it was listed
        return ""


def tcp_peers(pid: int, port: int, local: bool = False) -> int:
    """How many of the process's TCP sockets (any state but LISTEN) are connected to `port`, or with
    `local`, were accepted on `port` (its `socket:[inode]` fds matched against /proc/net/tcp)."""
    links = (_readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd"))
    inodes = {link[8:-1] for link in links if link.startswith("socket:[")}
    rows = (line.split() for line in Path("/proc/net/tcp").read_text().splitlines()[1:])
    return sum(
        1 for cols in rows
        if cols[9] in inodes and cols[3] != "0A" and int(cols[1 if local else 2].split(":")[1], 16) == port
    )  # fmt: skip


# ---- a strict origin that records what it receives ----------------------------------------------------------

_TOKEN = re.compile(rb"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
_REQUEST_LINE = re.compile(rb"^([A-Z]+) (\S+) HTTP/1\.[01]$")


class Malformed(Exception):
    """What the origin received is not one well-framed HTTP/1.1 request (RFC 9112)."""


class _Fields:
    headers: tuple[tuple[bytes, bytes], ...]

    def header(self, name: bytes) -> list[bytes]:
        """Every value of the field `name` (any case), in order."""
        return [v for k, v in self.headers if k.lower() == name.lower()]


@dataclass(frozen=True)
class Seen(_Fields):
    method: str
    target: str
    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes


def _chunked(buf: bytes, at: int) -> tuple[bytes, int] | None:
    body = bytearray()
    while True:
        end = buf.find(b"\r\n", at)
        if end < 0:
            return None
        size_text = buf[at:end]
        if not re.fullmatch(rb"[0-9A-Fa-f]{1,8}", size_text):
            raise Malformed(f"chunk size {size_text[:40]!r}")
        size = int(size_text, 16)
        at = end + 2
        if size == 0:
            if buf[at : at + 2] == b"\r\n":
                return bytes(body), at + 2
            if len(buf) < at + 2:
                return None
            raise Malformed("trailers are not expected from the proxy")
        if len(buf) < at + size + 2:
            return None
        if buf[at + size : at + size + 2] != b"\r\n":
            raise Malformed("chunk data not followed by CRLF")
        body += buf[at : at + size]
        at += size + 2


def parse_request(buf: bytes) -> tuple[Seen, int] | None:
    """One request from the front of `buf`: (request, bytes used), None while incomplete; Malformed when
    a strict recipient would refuse it (bare CR or LF, a space before a colon, two framings, ...)."""
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        return None
    head = buf[:end]
    if b"\n" in head.replace(b"\r\n", b"") or b"\r" in head.replace(b"\r\n", b""):
        raise Malformed("bare CR or LF in the head")
    lines = head.split(b"\r\n")
    m = _REQUEST_LINE.match(lines[0])
    if not m:
        raise Malformed(f"request line {lines[0][:80]!r}")
    headers = []
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep or not _TOKEN.match(name):
            raise Malformed(f"field line {line[:80]!r}")
        if re.search(rb"[\x00-\x08\x0a-\x1f\x7f]", value):
            raise Malformed(f"control byte in the value of {name!r}")
        headers.append((name, value.strip(b" \t")))
    seen = Seen(m[1].decode(), m[2].decode(), tuple(headers), b"")
    lengths, codings = seen.header(b"content-length"), seen.header(b"transfer-encoding")
    if len(lengths) > 1 or (lengths and codings) or len(codings) > 1:
        raise Malformed(f"ambiguous framing: content-length {lengths}, transfer-encoding {codings}")
    at = end + 4
    if codings:
        if codings[0].lower() != b"chunked":
            raise Malformed(f"transfer-encoding {codings[0]!r}")
        got = _chunked(buf, at)
        if got is None:
            return None
        body, at = got
    else:
        if lengths and not lengths[0].isdigit():
            raise Malformed(f"content-length {lengths[0]!r}")
        n = int(lengths[0]) if lengths else 0
        if len(buf) < at + n:
            return None
        body, at = buf[at : at + n], at + n
    return Seen(seen.method, seen.target, seen.headers, body), at


@dataclass
class Origin:
    """What the recording origin saw: every byte per connection, every request, every malformed head."""

    port: int = 0
    raw: list[bytearray] = field(default_factory=list)  # per connection
    stream: bytearray = field(default_factory=bytearray)  # every connection's bytes, in arrival order
    requests: list[Seen] = field(default_factory=list)
    malformed: list[str] = field(default_factory=list)
    replies: list[bytes] = field(default_factory=list)  # canned answers for the next requests, else an echo
    hold: bool = False  # record requests without answering them (until `release`)
    closed_by_peer: int = 0  # connections the other side closed
    held: list[tuple[_OriginProtocol, Seen]] = field(default_factory=list)

    def release(self) -> None:
        """Answer every request held so far, and the next ones at once."""
        self.hold = False
        while self.held:
            protocol, seen = self.held.pop(0)
            protocol.answer(seen)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def received(self) -> bytes:
        return bytes(self.stream)


class _OriginProtocol(asyncio.Protocol):
    def __init__(self, origin: Origin) -> None:
        self.origin = origin
        self.buf = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.raw = bytearray()
        self.origin.raw.append(self.raw)

    def connection_lost(self, exc: Exception | None) -> None:
        self.origin.closed_by_peer += 1

    def data_received(self, data: bytes) -> None:
        self.raw += data
        self.origin.stream += data
        self.buf += data
        while self.buf:
            try:
                got = parse_request(self.buf)
            except Malformed as exc:
                self.origin.malformed.append(str(exc))
                self.transport.close()
                return
            if got is None:
                return
            seen, used = got
            self.buf = self.buf[used:]
            self.origin.requests.append(seen)
            if self.origin.hold:
                self.origin.held.append((self, seen))
                continue
            self.answer(seen)

    def answer(self, seen: Seen) -> None:
        if self.origin.replies:
            self.transport.write(self.origin.replies.pop(0))
            return
        echo = orjson.dumps({"method": seen.method, "path": seen.target, "body": seen.body.decode("latin-1")})
        self.transport.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
            % (len(echo), echo)
        )


@asynccontextmanager
async def recording_origin() -> AsyncIterator[Origin]:
    origin = Origin()
    server = await asyncio.get_running_loop().create_server(lambda: _OriginProtocol(origin), "127.0.0.1", 0)
    origin.port = server.sockets[0].getsockname()[1]
    try:
        yield origin
    finally:
        server.close()


# ---- a raw-socket client -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Response(_Fields):
    status: int
    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes

    def echo(self) -> dict[str, str]:
        """The recording origin's echo of the request it parsed."""
        return dict(orjson.loads(self.body))


@dataclass(frozen=True)
class Exchange:
    responses: list[Response]
    closed: bool  # the server closed the connection after the last response


async def _read_response(reader: asyncio.StreamReader) -> Response | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if exc.partial:
            raise AssertionError(f"a truncated response head: {exc.partial[:200]!r}") from None
        return None
    lines = head[:-4].split(b"\r\n")
    status = int(lines[0].split(b" ", 2)[1])
    headers = tuple((k.strip(), v.strip()) for k, _, v in (line.partition(b":") for line in lines[1:]))
    response = Response(status, headers, b"")
    if response.header(b"transfer-encoding"):
        body = bytearray()
        while size := int((await reader.readuntil(b"\r\n")).split(b";")[0], 16):
            body += (await reader.readexactly(size + 2))[:-2]
        await reader.readuntil(b"\r\n")
        return Response(status, headers, bytes(body))
    length = response.header(b"content-length")
    body = await reader.readexactly(int(length[0])) if length else await reader.read()
    return Response(status, headers, body)


async def exchange(port: int, payload: bytes, sentinel: bool = True) -> Exchange:
    """Send `payload` raw, then (when `sentinel`) one well-formed GET /sentinel on the same connection, and
    read responses until the sentinel's answer or the server closes: no idle wait decides anything.
    Without the sentinel, the first response ends the exchange (`closed` then says nothing)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(payload + (SENTINEL if sentinel else b""))
        await writer.drain()
        responses: list[Response] = []
        async with asyncio.timeout(READ_DEADLINE_SECONDS):
            while (response := await _read_response(reader)) is not None:
                responses.append(response)
                if not sentinel or b'"/sentinel"' in response.body:
                    return Exchange(responses, closed=False)
        return Exchange(responses, closed=True)
    finally:
        writer.close()
