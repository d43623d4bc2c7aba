"""Every stream framing through a real islwatch proxy (`--inject-stream-usage`) against a raw-socket upstream.

The upstream answers as a server does: with the usage-only event only when the request asked for it. A raw
client must receive exactly what the upstream would have sent it without the proxy (the usage event taken
out, every other byte as sent), the proxy must record the server's count, and the upstream must receive the
client's body byte for byte with only `stream_options` added, and `Accept-Encoding: identity` in place of
a field that lets the server compress (the real openai client's included). Compressed streams are read
through a decompressing copy and never rewritten; a stream whose events end in CR alone is not held for an LF.
"""

from __future__ import annotations

import asyncio
import gzip
import socket
import urllib.request
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import openai
import orjson
import pytest

from proxy.server.app import run_proxy
from proxy.server.inspect import accepts_identity, identity_upstream, injection_refused
from proxy.server.upstream import identity_only
from tests.eventually import eventually
from tests.reliability.test_header_fidelity import DATE, raw_server
from tests.server.helpers import Background, parse_metrics, proxy_config, value

READ_DEADLINE_SECONDS = 30.0  # a guard against a proxy that holds bytes back, not a timing assertion
USAGE = {"prompt_tokens": 12, "completion_tokens": 2, "total_tokens": 14}
BASE = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}
FINAL = orjson.dumps({**BASE, "choices": [], "usage": USAGE})
ASKED = b'"include_usage":true'
BODY = b'{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}'


def _delta(text: str, finish: str | None = None) -> bytes:
    return orjson.dumps(
        {**BASE, "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}]}
    )


def _stream(nl: bytes, usage: bool, fields: bool = False, last_newline: bool = True) -> list[bytes]:
    """Events in framing `nl`; `fields`: comment, event:, id: lines and a data value split over two lines."""
    events = []
    for i, text in enumerate(["Hel", "lo"]):
        data = _delta(text, "stop" if i else None)
        lines = [b": c", b"event: delta", b"id: %d" % i] if fields else []
        if fields and i:
            cut = data.index(b',"choices"')
            lines += [b"data: " + data[:cut], b"data: " + data[cut:]]
        else:
            lines.append(b"data: " + data)
        events.append(nl.join(lines) + nl + nl)
    if usage:
        lines = [b"event: delta", b"id: 9", b"retry: 500"] if fields else []
        events.append(nl.join([*lines, b"data: " + FINAL]) + nl + nl)
    events.append(b"data: [DONE]" + (nl + nl if last_newline else b""))
    return events


@dataclass(frozen=True)
class Answer:
    content_type: bytes
    events: Callable[[bool], list[bytes]]  # the events, given whether the request asked for usage
    coding: bytes = b""  # b"gzip": the body is sent gzip-compressed

    def body(self, asked: bool) -> bytes:
        body = b"".join(self.events(asked))
        return gzip.compress(body, mtime=0) if self.coding else body


ANSWERS = {
    "lf": Answer(b"text/event-stream", lambda u: _stream(b"\n", u)),
    "crlf-fields": Answer(b"text/event-stream", lambda u: _stream(b"\r\n", u, fields=True)),
    "cr-fields": Answer(b"text/event-stream", lambda u: _stream(b"\r", u, fields=True)),
    "cr-no-last-newline": Answer(b"text/event-stream", lambda u: _stream(b"\r", u, last_newline=False)),
    "media-type-case": Answer(b"Text/Event-Stream; charset=utf-8", lambda u: _stream(b"\n", u)),
    "gzip": Answer(b"text/event-stream", lambda u: _stream(b"\n", u), coding=b"gzip"),
}


def _head(answer: Answer, asked: bool, chunked: bool = True) -> bytes:
    coding = b"Content-Encoding: %s\r\n" % answer.coding if answer.coding else b""
    framing = b"Transfer-Encoding: chunked\r\n" if chunked else b""
    return (
        b"HTTP/1.1 200 OK\r\n" + DATE + b"Content-Type: " + answer.content_type + b"\r\n" + coding + framing
        + b"Connection: close\r\n\r\n"
    )  # fmt: skip


def _chunked(*pieces: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces if p) + b"0\r\n\r\n"


@dataclass
class Upstream:
    """Answers each request per its `X-Answer` field, recording the body bytes it received. With `hold` set,
    it sends the head and the first event, then waits for `release` before the rest."""

    bodies: list[bytes] = field(default_factory=list)
    heads: list[bytes] = field(default_factory=list)  # each request's head, as received
    hold: bool = False
    waiting: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    raw_answers: dict[bytes, bytes] = field(default_factory=dict)  # X-Answer -> a whole canned response
    first: bytes = b""  # the compressed bytes of a held gzip answer's first event

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            self.heads.append(head)
            fields = dict(
                (line.split(b":", 1)[0].strip().lower(), line.split(b":", 1)[1].strip())
                for line in head.split(b"\r\n")[1:]
                if b":" in line
            )
            body = await reader.readexactly(int(fields.get(b"content-length", b"0")))
            self.bodies.append(body)
            name = fields.get(b"x-answer", b"lf")
            if name in self.raw_answers:
                writer.write(self.raw_answers[name])
                await writer.drain()
                return
            answer = ANSWERS[name.decode()]
            asked = ASKED in body.replace(b" ", b"")
            events = answer.events(asked)
            if self.hold and answer.coding:  # the first event sync-flushed, so a client can read it at once
                packer = zlib.compressobj(wbits=31)
                self.first = packer.compress(events[0]) + packer.flush(zlib.Z_SYNC_FLUSH)
                writer.write(_head(answer, asked) + b"%x\r\n%s\r\n" % (len(self.first), self.first))
                self.waiting.set()
                await writer.drain()
                await self.release.wait()
                writer.write(_chunked(packer.compress(b"".join(events[1:])) + packer.flush()))
            elif self.hold:
                writer.write(_head(answer, asked) + b"%x\r\n%s\r\n" % (len(events[0]), events[0]))
                self.waiting.set()
                await writer.drain()
                await self.release.wait()
                writer.write(_chunked(*events[1:]))
            else:
                writer.write(_head(answer, asked) + _chunked(answer.body(asked)))
            await writer.drain()
        finally:
            writer.close()


@dataclass
class Servers:
    bg: Background
    upstream: Upstream
    port: int
    admin_url: str

    def metrics(self) -> dict:
        with urllib.request.urlopen(self.admin_url + "/metrics", timeout=READ_DEADLINE_SECONDS) as r:
            return parse_metrics(r.read().decode())

    def settled_after(self, before: dict, name: str, **labels: str) -> dict:
        """Wait until the counter `name{labels}` moved past `before` and the analysis queue is empty."""
        return eventually(
            self.metrics,
            lambda m: (
                value(m, name, **labels) > value(before, name, **labels)
                and value(m, "islwatch_analysis_queue_depth") == 0
            ),
            what=f"{name}{labels} counted",
        )


@pytest.fixture(scope="module")
def servers() -> Iterator[Servers]:
    bg = Background()
    upstream = Upstream()
    try:
        url = bg.enter(raw_server(upstream))  # type: ignore[arg-type]
        proxy = bg.enter(run_proxy(proxy_config(url, inject_stream_usage=True, server_probe="off")))
        yield Servers(bg, upstream, int(proxy.url.rsplit(":", 1)[1]), proxy.admin_url)
    finally:
        bg.close()


def _request(body: bytes, *fields: bytes) -> bytes:
    extra = b"".join(f + b"\r\n" for f in fields)
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: proxy\r\nContent-Type: application/json\r\n" + extra
        + b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body
    )  # fmt: skip


def _field_lines(head: bytes, name: bytes) -> list[bytes]:
    """The field lines of `head` named `name` (any case), whole, as received."""
    return [line for line in head.split(b"\r\n")[1:] if line.split(b":", 1)[0].lower() == name.lower()]


def _dechunk(data: bytes) -> bytes:
    out, at = [], 0
    while True:
        end = data.index(b"\r\n", at)
        size = int(data[at:end].split(b";")[0], 16)
        if size == 0:
            return b"".join(out)
        out.append(data[end + 2 : end + 2 + size])
        at = end + 2 + size + 2


def _exchange(servers: Servers, request: bytes) -> tuple[bytes, bytes]:
    """(head, decoded body framing) of the proxy's answer, read to the close."""
    with socket.create_connection(("127.0.0.1", servers.port), timeout=READ_DEADLINE_SECONDS) as s:
        s.sendall(request)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    chunked = b"transfer-encoding: chunked" in head.lower()
    return head, _dechunk(body) if chunked else body


@pytest.mark.parametrize("name", [n for n in ANSWERS if n != "gzip"])
def test_each_framing_is_stripped_exactly_and_counted(servers: Servers, name: str) -> None:
    answer = ANSWERS[name]
    before = servers.metrics()
    head, body = _exchange(servers, _request(BODY, b"X-Answer: " + name.encode()))
    assert head.startswith(b"HTTP/1.1 200")
    assert body == answer.body(False)  # what the upstream sends a client that did not ask for usage
    assert servers.upstream.bodies[-1] == BODY[:-1] + b',"stream_options":{"include_usage":true}}'
    # The client sent no Accept-Encoding (any coding then): the upstream is told identity, so it cannot
    # compress a stream that must be edited.
    assert _field_lines(servers.upstream.heads[-1], b"accept-encoding") == [b"Accept-Encoding: identity"]
    after = servers.settled_after(before, "islwatch_isl_tokens_count", kind="server")
    assert (
        value(after, "islwatch_isl_tokens_sum", kind="server")
        - value(before, "islwatch_isl_tokens_sum", kind="server")
        == 12
    )
    stripped = "islwatch_stream_usage_injections_total"
    assert value(after, stripped, result="stripped") == value(before, stripped, result="stripped") + 1


@pytest.mark.parametrize(
    "accept",
    [
        b"Accept-Encoding: gzip, identity;q=0",
        b"Accept-Encoding: br, *;q=0",
        b"accept-encoding: gzip;q=1, IDENTITY; q=0.000",
    ],
)
def test_a_client_that_refuses_identity_is_not_rewritten(servers: Servers, accept: bytes) -> None:
    """The server will compress its answer and a compressed stream cannot be edited: the request goes as
    sent, its Accept-Encoding line included, and the answer (no usage: not asked) is relayed byte for byte
    and counted without a server count."""
    before = servers.metrics()
    head, body = _exchange(servers, _request(BODY, b"X-Answer: gzip", accept))
    assert servers.upstream.bodies[-1] == BODY
    assert _field_lines(servers.upstream.heads[-1], b"accept-encoding") == [accept]
    assert body == ANSWERS["gzip"].body(False) and b"content-encoding: gzip" in head.lower()
    after = servers.settled_after(before, "islwatch_isl_match_total", result="no_server_count")
    skipped = "islwatch_stream_usage_injections_total"
    assert (
        value(after, skipped, result="skipped_encoding")
        == value(before, skipped, result="skipped_encoding") + 1
    )


@pytest.mark.parametrize(
    "accept",
    [b"Accept-Encoding: gzip, deflate", b"Accept-Encoding: gzip, deflate, br, zstd", b"Accept-Encoding: *"],
)
def test_a_client_that_accepts_compression_and_identity_is_asked_identity(
    servers: Servers, accept: bytes
) -> None:
    """httpx (the OpenAI SDK) sends `gzip, deflate`: usage is asked, with `Accept-Encoding: identity` in
    place of the client's line (the other lines in their order), and the client gets the uncompressed
    stream it would have got without the proxy, the usage event taken out."""
    before = servers.metrics()
    request = _request(BODY, b"X-Before: 1", accept, b"X-After: 2", b"X-Answer: lf")
    head, body = _exchange(servers, request)
    assert head.startswith(b"HTTP/1.1 200") and b"content-encoding" not in head.lower()
    assert body == ANSWERS["lf"].body(False)
    assert servers.upstream.bodies[-1] == BODY[:-1] + b',"stream_options":{"include_usage":true}}'
    lines = servers.upstream.heads[-1].split(b"\r\n")
    at = lines.index(b"X-Before: 1")
    assert lines[at : at + 3] == [b"X-Before: 1", b"Accept-Encoding: identity", b"X-After: 2"]
    assert _field_lines(servers.upstream.heads[-1], b"accept-encoding") == [b"Accept-Encoding: identity"]
    after = servers.settled_after(before, "islwatch_stream_usage_injections_total", result="stripped")
    assert (
        value(after, "islwatch_isl_tokens_sum", kind="server")
        - value(before, "islwatch_isl_tokens_sum", kind="server")
        == 12
    )


def test_the_openai_client_with_its_default_headers_is_injected(servers: Servers) -> None:
    """The real openai client (httpx, `Accept-Encoding: gzip, deflate`...) streaming a chat: the upstream
    is asked usage, uncompressed; the client's chunks hold no usage; the proxy counts the server's."""
    client = openai.OpenAI(
        base_url=f"http://127.0.0.1:{servers.port}/v1",
        api_key="test",
        max_retries=0,
        timeout=READ_DEADLINE_SECONDS,
    )
    before = servers.metrics()
    try:
        stream = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        chunks = list(stream)
    finally:
        client.close()
    assert [c.choices[0].delta.content for c in chunks] == ["Hel", "lo"]
    assert all(c.choices and c.usage is None for c in chunks)
    head = servers.upstream.heads[-1]
    assert b"/v1/chat/completions" in head.split(b"\r\n")[0]
    assert ASKED in servers.upstream.bodies[-1]
    assert b'"stream_options":{"include_usage":true}' in servers.upstream.bodies[-1]
    assert _field_lines(head, b"accept-encoding") == [b"Accept-Encoding: identity"]
    after = servers.settled_after(before, "islwatch_stream_usage_injections_total", result="stripped")
    assert (
        value(after, "islwatch_isl_tokens_sum", kind="server")
        - value(before, "islwatch_isl_tokens_sum", kind="server")
        == 12
    )


@pytest.mark.parametrize(
    ("body", "counted"),
    [
        # Not streaming (the lf answer holds no usage then: counted without a server count).
        (
            b'{"model":"m","messages":[{"role":"user","content":"hi"}]}',
            ("islwatch_isl_match_total", {"result": "no_server_count"}),
        ),
        # Streaming, usage asked by the client itself.
        (
            BODY[:-1] + b',"stream_options":{"include_usage":true}}',
            ("islwatch_isl_tokens_count", {"kind": "server"}),
        ),
    ],
    ids=["json", "asked"],
)
def test_accept_encoding_of_a_request_not_injected_goes_as_sent(
    servers: Servers, body: bytes, counted: tuple[str, dict[str, str]]
) -> None:
    accept = b"accept-ENCODING: gzip ;q=0.8,  br, deflate;q=0.1"
    before = servers.metrics()
    _exchange(servers, _request(body, b"X-Answer: lf", accept, b"Accept-Encoding: zstd"))
    assert servers.upstream.bodies[-1] == body
    lines = _field_lines(servers.upstream.heads[-1], b"accept-encoding")
    assert lines == [accept, b"Accept-Encoding: zstd"]  # both lines, byte for byte
    servers.settled_after(before, counted[0], **counted[1])  # analysed before the next test's snapshot


@pytest.mark.parametrize(
    ("field", "refused", "identity"),
    [
        (None, None, True),  # absent: any coding (RFC 9110 12.5.3), made explicit
        ("", None, False),  # empty: identity only
        ("identity", None, False),
        ("gzip, deflate", None, True),
        ("gzip;q=0, identity", None, False),
        ("gzip, identity;q=0", "skipped_encoding", False),
        ("gzip, *;q=0", "skipped_encoding", False),
        ("gzip, *;q=0, identity;q=0.5", None, True),
        ("gzip, identity;q=0.001", None, True),
        ("*", None, True),
        ("*;q=0", None, False),  # accepts nothing: the server answers identity or refuses, either unedited
    ],
)
def test_what_an_accept_encoding_field_allows(field: str | None, refused: str | None, identity: bool) -> None:
    obj = {"stream": True}
    assert injection_refused(obj, field) == refused
    assert (refused is None and identity_upstream(field)) is identity
    assert injection_refused({**obj, "stream_options": None}, field) == "skipped_options"


def test_identity_only_replaces_every_accept_encoding_line_where_the_first_stood() -> None:
    fields = [("A", "1"), ("accept-encoding", "gzip"), ("B", "2"), ("Accept-Encoding", "br"), ("C", "3")]
    assert identity_only(fields) == [("A", "1"), ("Accept-Encoding", "identity"), ("B", "2"), ("C", "3")]
    assert identity_only([("A", "1")]) == [("A", "1"), ("Accept-Encoding", "identity")]
    assert accepts_identity("br, IDENTITY;Q=0") is False


def test_a_gzip_stream_that_asked_for_usage_is_read_through_a_decompressing_copy(servers: Servers) -> None:
    asked = BODY[:-1] + b',"stream_options":{"include_usage":true}}'
    before = servers.metrics()
    _, body = _exchange(servers, _request(asked, b"X-Answer: gzip", b"Accept-Encoding: gzip"))
    assert servers.upstream.bodies[-1] == asked
    assert _field_lines(servers.upstream.heads[-1], b"accept-encoding") == [b"Accept-Encoding: gzip"]
    assert body == ANSWERS["gzip"].body(True)  # the compressed bytes as the upstream sent them
    after = servers.settled_after(before, "islwatch_isl_tokens_count", kind="server")
    assert (
        value(after, "islwatch_isl_tokens_sum", kind="server")
        - value(before, "islwatch_isl_tokens_sum", kind="server")
        == 12
    )


def test_a_stream_compressed_unasked_is_relayed_as_sent(servers: Servers) -> None:
    """A client that sends no Accept-Encoding is asked usage for, with `Accept-Encoding: identity`; a
    server that compresses anyway gets its bytes relayed as sent (a compressed stream cannot be edited),
    counted `compressed`, usage still read."""
    before = servers.metrics()
    head, body = _exchange(servers, _request(BODY, b"X-Answer: gzip"))
    assert ASKED in servers.upstream.bodies[-1]
    assert _field_lines(servers.upstream.heads[-1], b"accept-encoding") == [b"Accept-Encoding: identity"]
    assert body == ANSWERS["gzip"].body(True) and b"content-encoding: gzip" in head.lower()
    after = servers.settled_after(before, "islwatch_isl_tokens_count", kind="server")
    assert (
        value(after, "islwatch_isl_tokens_sum", kind="server")
        - value(before, "islwatch_isl_tokens_sum", kind="server")
        == 12
    )
    compressed = "islwatch_stream_usage_injections_total"
    assert value(after, compressed, result="compressed") == value(before, compressed, result="compressed") + 1


def test_the_request_body_keeps_every_byte_but_the_added_member(servers: Servers) -> None:
    """Integers beyond 64 bits, duplicate and escaped keys, odd whitespace: as the client sent them."""
    body = (
        b'{ "\\u006dodel" : "m",\n\t"seed": 123456789012345678901234567890, "user": 18446744073709551616,'
        b' "max_tokens": 4, "max_tokens": 5, "temperature": 1E-7, "messages": [{"role": "user", '
        b'"content": "caf\\u00e9 \\ud83d\\ude00"}], "stream" : true }\r\n  '
    )
    before = servers.metrics()
    _exchange(servers, _request(body, b"X-Answer: lf"))
    closing = body.rindex(b"}")
    assert servers.upstream.bodies[-1] == (
        body[:closing] + b',"stream_options":{"include_usage":true}' + body[closing:]
    )
    # Analysed before the next test's snapshot.
    servers.settled_after(before, "islwatch_isl_tokens_count", kind="server")


@pytest.mark.parametrize(
    "options", [b'"stream_options":{"include_usage":false}', b'"stream_options":null', b'"stream_options":{}']
)
def test_a_body_with_stream_options_is_not_rewritten(servers: Servers, options: bytes) -> None:
    body = BODY[:-1] + b"," + options + b"}"
    before = servers.metrics()
    _, received = _exchange(servers, _request(body, b"X-Answer: lf"))
    assert servers.upstream.bodies[-1] == body and received == ANSWERS["lf"].body(False)
    after = servers.settled_after(before, "islwatch_isl_match_total", result="no_server_count")
    skipped = "islwatch_stream_usage_injections_total"
    assert (
        value(after, skipped, result="skipped_options")
        == value(before, skipped, result="skipped_options") + 1
    )


def _held_exchange(servers: Servers, name: str, request: bytes, first: Callable[[], bytes]) -> bytes:
    """Send `request`; the upstream sends its head and first event, then waits: the client must receive
    `first()` (what the upstream sent of that event) while the upstream still waits. The whole answer."""

    def arm() -> None:
        servers.upstream.hold = True
        servers.upstream.waiting, servers.upstream.release = asyncio.Event(), asyncio.Event()

    servers.bg.call(arm)
    try:
        with socket.create_connection(("127.0.0.1", servers.port), timeout=READ_DEADLINE_SECONDS) as s:
            s.sendall(request)
            data = b""
            while not servers.bg.call(servers.upstream.waiting.is_set) or first() not in data:
                try:
                    chunk = s.recv(65536)
                except TimeoutError:
                    raise AssertionError(f"the first event is held back; the client has {data!r}") from None
                assert chunk, data
                data += chunk
            assert servers.bg.call(lambda: not servers.upstream.release.is_set())
            servers.bg.loop.call_soon_threadsafe(servers.upstream.release.set)
            while chunk := s.recv(65536):
                data += chunk
        return _dechunk(data.partition(b"\r\n\r\n")[2])
    finally:
        servers.bg.loop.call_soon_threadsafe(servers.upstream.release.set)
        servers.bg.call(lambda: setattr(servers.upstream, "hold", False))


def test_a_cr_only_event_is_not_held_for_a_newline(servers: Servers) -> None:
    """The upstream sends its head and first CR-framed event, then waits: the client gets that event while
    the upstream still holds the rest (the old stripper waited for an LF)."""
    first = _stream(b"\r", usage=True, fields=True)[0]
    before = servers.metrics()
    body = _held_exchange(servers, "cr-fields", _request(BODY, b"X-Answer: cr-fields"), lambda: first)
    assert body == ANSWERS["cr-fields"].body(False)
    servers.settled_after(before, "islwatch_isl_tokens_count", kind="server")


def test_a_compressed_event_is_not_held(servers: Servers) -> None:
    """A server that compresses a stream it was asked usage for (and identity: the client sent no
    Accept-Encoding): the compressed bytes of its first event reach the client while the upstream waits (the
    old stripper split the compressed bytes on LF and held them)."""
    before = servers.metrics()
    received = _held_exchange(
        servers,
        "gzip",
        _request(BODY, b"X-Answer: gzip"),
        lambda: servers.bg.call(lambda: servers.upstream.first),
    )
    assert zlib.decompress(received, wbits=31) == b"".join(ANSWERS["gzip"].events(True))
    servers.settled_after(before, "islwatch_isl_tokens_count", kind="server")


def test_a_big_json_answer_counts_its_top_level_usage_only(servers: Servers) -> None:
    """Over 64 KiB, with a gateway's trace block holding a nested usage after the server's."""
    answer = orjson.dumps(
        {
            "id": "x",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "w" * 100_000}}],
            "usage": {"prompt_tokens": 7306, "completion_tokens": 1, "total_tokens": 7307},
            "trace": {"usage": {"prompt_tokens": 3}},
        }
    )
    servers.upstream.raw_answers[b"big-json"] = (
        b"HTTP/1.1 200 OK\r\n" + DATE + b"Content-Type: application/json\r\n"
        b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(answer) + answer
    )
    body = b'{"model":"m","messages":[{"role":"user","content":"hi"}]}'
    before = servers.metrics()
    _, received = _exchange(servers, _request(body, b"X-Answer: big-json"))
    assert received == answer
    after = servers.settled_after(before, "islwatch_isl_tokens_count", kind="server")
    assert (
        value(after, "islwatch_isl_tokens_sum", kind="server")
        - value(before, "islwatch_isl_tokens_sum", kind="server")
        == 7306
    )


def test_a_gzip_json_answer_is_read_through_a_decompressing_copy(servers: Servers) -> None:
    answer = orjson.dumps(
        {"id": "x", "choices": [{"message": {"content": "z" * 90_000}}], "usage": {"prompt_tokens": 41}}
    )
    packed = gzip.compress(answer, mtime=0)
    servers.upstream.raw_answers[b"gzip-json"] = (
        b"HTTP/1.1 200 OK\r\n" + DATE + b"Content-Type: application/json\r\nContent-Encoding: gzip\r\n"
        b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(packed) + packed
    )
    body = b'{"model":"m","messages":[{"role":"user","content":"hi"}]}'
    before = servers.metrics()
    _, received = _exchange(servers, _request(body, b"X-Answer: gzip-json", b"Accept-Encoding: gzip"))
    assert received == packed  # relayed compressed, as sent
    after = servers.settled_after(before, "islwatch_isl_tokens_count", kind="server")
    assert (
        value(after, "islwatch_isl_tokens_sum", kind="server")
        - value(before, "islwatch_isl_tokens_sum", kind="server")
        == 41
    )
