"""Request smuggling and header injection, on raw sockets at both ends: the proxy refuses a message whose
framing is ambiguous or invalid (400, then closes, as RFC 9112 has a server do) or forwards exactly the one
request a compliant server would read; a strict origin behind it (reliability_peers.parse_request) records
every byte, so a smuggled second request, a field line injected with a CR or LF, or a request framed two
ways would show there. Every payload is followed on the same connection by a well-formed GET /sentinel:
its answer (or the proxy closing) ends each exchange, no idle wait decides anything.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from proxy.server.app import run_proxy
from tests.reliability.reliability_peers import SENTINEL, Exchange, Origin, Seen, exchange, recording_origin
from tests.server.helpers import Background, proxy_config

POST = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
SMUGGLED = b"GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n"


@dataclass(frozen=True)
class Framing:
    payload: bytes
    body: bytes | None  # None: refused (RFC 9112 says 400 and close); else the body a compliant server reads


# RFC 9112 6.1: Transfer-Encoding with Content-Length, or chunked not last: 400 and close. 6.3: invalid or
# differing Content-Length values: unrecoverable, 400. 5.1: no whitespace between a field name and the
# colon: 400. 5.2: obs-fold: 400 (or replace it with SP). 2.2: a bare CR: invalid. 7.1: chunk sizes are hex
# digits. aiohttp's llhttp parser refuses a bare LF and duplicate Content-Length too (which RFC 9112 permits).
FRAMINGS = {
    "cl-te": Framing(POST + b"Content-Length: 6\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + SMUGGLED, None),
    "te-cl": Framing(POST + b"Transfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n5c\r\n" + SMUGGLED + b"\r\n0\r\n\r\n", None),
    "te-xchunked": Framing(POST + b"Transfer-Encoding: xchunked\r\nContent-Length: 37\r\n\r\n" + SMUGGLED, None),
    "te-chunked-then-identity": Framing(POST + b"Transfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n" + SMUGGLED, None),
    "te-twice": Framing(POST + b"Transfer-Encoding: chunked\r\nTransfer-Encoding: x\r\n\r\n0\r\n\r\n" + SMUGGLED, None),
    "te-space-before-colon": Framing(POST + b"Transfer-Encoding : chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n" + SMUGGLED, None),
    "te-obs-fold": Framing(POST + b"Transfer-Encoding:\r\n chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n" + SMUGGLED, None),
    "te-leading-space": Framing(POST + b" Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n" + SMUGGLED, None),
    "te-http-1.0": Framing(b"POST /v1/chat/completions HTTP/1.0\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + SMUGGLED, None),
    "cl-duplicate-differing": Framing(POST + b"Content-Length: 5\r\nContent-Length: 42\r\n\r\nhello" + SMUGGLED, None),
    "cl-duplicate-same": Framing(POST + b"Content-Length: 5\r\nContent-Length: 5\r\n\r\nhello", None),
    "cl-list": Framing(POST + b"Content-Length: 5, 42\r\n\r\nhello" + SMUGGLED, None),
    "cl-plus-sign": Framing(POST + b"Content-Length: +5\r\n\r\nhello", None),
    "cl-hex": Framing(POST + b"Content-Length: 0x5\r\n\r\nhello", None),
    "cl-negative": Framing(POST + b"Content-Length: -1\r\n\r\n" + SMUGGLED, None),
    "cl-overflow": Framing(POST + b"Content-Length: 18446744073709551621\r\n\r\nhello" + SMUGGLED, None),
    "cl-space-before-colon": Framing(POST + b"Content-Length : 37\r\n\r\n" + SMUGGLED, None),
    "bare-lf-head": Framing(b"POST /v1/chat/completions HTTP/1.1\nHost: x\nContent-Length: 5\n\nhello", None),
    "chunk-bare-lf": Framing(POST + b"Transfer-Encoding: chunked\r\n\r\n5\nhello\n0\n\n" + SMUGGLED, None),
    "chunk-size-overflow": Framing(POST + b"Transfer-Encoding: chunked\r\n\r\nFFFFFFFFFFFFFFFFF5\r\nhello\r\n0\r\n\r\n" + SMUGGLED, None),
    "chunk-size-negative": Framing(POST + b"Transfer-Encoding: chunked\r\n\r\n-5\r\nhello\r\n0\r\n\r\n" + SMUGGLED, None),
    "chunk-size-space": Framing(POST + b"Transfer-Encoding: chunked\r\n\r\n5 \r\nhello\r\n0\r\n\r\n" + SMUGGLED, None),
    "chunk-data-longer": Framing(POST + b"Transfer-Encoding: chunked\r\n\r\n3\r\nhello\r\n0\r\n\r\n" + SMUGGLED, None),
    # Valid framings: exactly one request reaches the origin, with this body.
    "te-tab": Framing(POST + b"Transfer-Encoding:\tchunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", b"hello"),
    "te-upper-case": Framing(POST + b"Transfer-Encoding: CHUNKED\r\n\r\n5\r\nhello\r\n0\r\n\r\n", b"hello"),
    "chunk-extension": Framing(POST + b"Transfer-Encoding: chunked\r\n\r\n5;name=value\r\nhello\r\n0\r\n\r\n", b"hello"),
    "chunks-several": Framing(POST + b"Transfer-Encoding: chunked\r\n\r\n2\r\nhe\r\n3\r\nllo\r\n0\r\n\r\n", b"hello"),
    "cl-body-holds-a-request": Framing(POST + b"Content-Length: %d\r\n\r\n" % len(SMUGGLED) + SMUGGLED, SMUGGLED),
}  # fmt: skip

# RFC 9110 5.5: CR, LF and NUL are never part of a field value; a recipient refuses them (RFC 9112 2.2, 5.2).
INJECTIONS = {
    "bare-cr-in-value": POST + b"X-A: a\rX-Injected: 1\r\nContent-Length: 2\r\n\r\n{}",
    "bare-lf-in-value": POST + b"X-A: a\nX-Injected: 1\r\nContent-Length: 2\r\n\r\n{}",
    "nul-in-value": POST + b"X-A: a\x00X-Injected: 1\r\nContent-Length: 2\r\n\r\n{}",
    "cr-in-name": POST + b"X-A\rX-Injected: 1\r\nContent-Length: 2\r\n\r\n{}",
    "lf-in-target": b"GET /v1/models\nX-Injected: 1 HTTP/1.1\r\nHost: x\r\n\r\n",
    "obs-fold-continues-a-value": POST + b"X-A: a\r\n X-Injected: 1\r\nContent-Length: 2\r\n\r\n{}",
}


@dataclass
class Peers:
    bg: Background
    origin: Origin
    port: int


@pytest.fixture(scope="module")
def peers() -> Iterator[Peers]:
    bg = Background()
    try:
        origin = bg.enter(recording_origin())
        url, _, _ = bg.enter(run_proxy(proxy_config(origin.url, tokenizer="none", server_probe="off")))
        yield Peers(bg, origin, int(url.rsplit(":", 1)[1]))
    finally:
        bg.close()


@dataclass(frozen=True)
class Probe:
    got: Exchange
    seen: list[Seen]  # the requests the origin parsed meanwhile
    raw: bytes  # every byte the origin received meanwhile


def probe(peers: Peers, payload: bytes) -> Probe:
    """One raw exchange through the proxy, and what reached the origin during it."""
    requests, received = len(peers.origin.requests), len(peers.origin.received())
    got = peers.bg.run(exchange(peers.port, payload))
    return Probe(got, peers.origin.requests[requests:], peers.origin.received()[received:])


def assert_clean(peers: Peers, p: Probe, body: bytes = b"") -> None:
    """The origin parsed every request it got as framed one way (a second framing, a bare CR or LF would
    be Malformed there), and no smuggled request or injected field line reached it outside a body."""
    assert not peers.origin.malformed, peers.origin.malformed
    outside = p.raw.replace(body, b"") if body else p.raw
    assert b"smuggled" not in outside and b"X-Injected" not in outside, p.raw


@pytest.mark.parametrize("name", FRAMINGS)
def test_framing_is_refused_or_forwarded_as_one_request(peers: Peers, name: str) -> None:
    framing = FRAMINGS[name]
    p = probe(peers, framing.payload)
    if framing.body is None:
        assert [r.status for r in p.got.responses] == [400] and p.got.closed, p.got
        assert p.seen == [] and p.raw == b""
    else:
        # After a chunked body the proxy closes (handler._last_if_chunked): the sentinel is not read.
        chunked = b"chunked" in framing.payload.partition(b"\r\n\r\n")[0].lower()
        forwarded = [("/v1/chat/completions", framing.body)] + ([] if chunked else [("/sentinel", b"")])
        assert [r.status for r in p.got.responses] == [200] * len(forwarded), p.got
        assert p.got.closed == chunked
        assert [(s.target, s.body) for s in p.seen] == forwarded
        assert p.got.responses[0].echo()["body"] == framing.body.decode()
    assert_clean(peers, p, framing.body or b"")


@pytest.mark.parametrize("name", INJECTIONS)
def test_cr_lf_nul_in_a_head_is_refused(peers: Peers, name: str) -> None:
    p = probe(peers, INJECTIONS[name])
    assert [r.status for r in p.got.responses] == [400] and p.got.closed, p.got
    assert p.seen == [] and p.raw == b""


def test_pipelined_requests_are_answered_in_order_each_forwarded_once(peers: Peers) -> None:
    payload = POST + b"Content-Length: 2\r\n\r\n{}" + b"GET /second HTTP/1.1\r\nHost: x\r\n\r\n"
    p = probe(peers, payload)
    assert [r.echo()["path"] for r in p.got.responses] == ["/v1/chat/completions", "/second", "/sentinel"]
    assert [s.target for s in p.seen] == ["/v1/chat/completions", "/second", "/sentinel"]
    assert_clean(peers, p)


def test_a_chunked_bodys_trailer_never_reaches_another_request(peers: Peers) -> None:
    """aiohttp 3.14's C parser keeps a chunked body's last trailer field half-processed and adds it to the
    head of the NEXT request on the connection (a header one client could plant in the request that
    follows on a connection a load balancer shares). A compliant server drops trailers it does not use
    (RFC 9110 6.5.1) and never moves them into another message."""
    payload = POST + b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nX-Planted: 1\r\n\r\n"
    p = probe(peers, payload)
    assert p.got.responses[0].status == 200 and p.got.responses[0].echo()["body"] == "hello"
    assert b"X-Planted" not in p.raw
    # The sentinel is either answered without the field or not read at all (the proxy closed first).
    assert [s.target for s in p.seen] in (["/v1/chat/completions", "/sentinel"], ["/v1/chat/completions"])
    assert_clean(peers, p)
    # A client that sends its next request on a new connection is served as usual.
    assert [r.echo()["path"] for r in probe(peers, b"").got.responses] == ["/sentinel"]


def test_the_origins_head_is_the_proxys_own_framing(peers: Peers) -> None:
    """Whatever framing the client used, the origin gets one Content-Length (or chunked) and the Host of the
    configured upstream; hop-by-hop fields the client sent stay on the client's hop (RFC 9110 7.6.1)."""
    payload = (
        POST + b"Transfer-Encoding: chunked\r\nConnection: keep-alive, X-Hop\r\nX-Hop: 1\r\nKeep-Alive: 5\r\n"
        b"TE: trailers\r\nUpgrade: h2c\r\nProxy-Connection: keep-alive\r\n\r\n2\r\n{}\r\n0\r\n\r\n"
    )
    p = probe(peers, payload)
    assert p.got.responses[0].status == 200
    seen = p.seen
    names = {k.lower() for k, _ in seen[0].headers}
    assert names.isdisjoint(
        {b"x-hop", b"keep-alive", b"te", b"upgrade", b"proxy-connection", b"transfer-encoding"}
    )
    assert seen[0].header(b"host") == [f"127.0.0.1:{peers.origin.port}".encode()]
    assert seen[0].header(b"content-length") == [b"2"] and seen[0].body == b"{}"


def test_upstream_heads_with_cr_lf_or_two_framings_fail_as_they_would_directly(peers: Peers) -> None:
    """The other direction: an upstream head that a client must refuse is never relayed; the client gets the
    proxy's 502 (a direct client gets a parse error) and the next request is served."""
    bad = [
        b"HTTP/1.1 200 OK\r\nX-A: a\rX-Injected: 1\r\nContent-Length: 2\r\n\r\nok",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok!",
        b"HTTP/1.1 200 OK\r\nX-A: a\x00X-Injected: 1\r\nContent-Length: 2\r\n\r\nok",
    ]
    for head in bad:
        peers.origin.replies.append(head)
        got = peers.bg.run(
            exchange(peers.port, b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n", sentinel=False)
        )
        assert [r.status for r in got.responses] == [502], (head, got)
        assert b"X-Injected" not in b"".join(v for r in got.responses for _, v in r.headers)
    p = probe(peers, b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
    assert [r.status for r in p.got.responses] == [200, 200]


def test_sentinel_alone_is_answered(peers: Peers) -> None:
    """The probe's control: the sentinel on its own is forwarded and answered."""
    got = peers.bg.run(exchange(peers.port, b"", sentinel=True))
    assert [r.echo()["path"] for r in got.responses] == ["/sentinel"]
    assert SENTINEL.startswith(b"GET /sentinel ")
