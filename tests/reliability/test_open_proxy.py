"""The proxy is not an open proxy: whatever the request says (an absolute-form target naming another host,
CONNECT, a Host header, a target that would re-parse as another authority, forwarding headers, an upgrade,
a redirect from the upstream, HTTP_PROXY in the environment), it talks to its one configured upstream only.

Two recording origins on raw sockets (reliability_peers): the configured one, and `elsewhere`, which every
request tries to reach: after each probe, `elsewhere` has received no byte and no connection.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from proxy.server.app import run_proxy
from tests.reliability.reliability_peers import Exchange, Origin, exchange, recording_origin
from tests.server.helpers import Background, proxy_config


@dataclass
class Peers:
    bg: Background
    origin: Origin
    elsewhere: Origin
    port: int

    @property
    def other(self) -> bytes:
        return f"127.0.0.1:{self.elsewhere.port}".encode()

    @property
    def own(self) -> bytes:
        return f"127.0.0.1:{self.origin.port}".encode()


@pytest.fixture(scope="module")
def peers() -> Iterator[Peers]:
    bg = Background()
    try:
        origin, elsewhere = bg.enter(recording_origin()), bg.enter(recording_origin())
        url, _, _ = bg.enter(run_proxy(proxy_config(origin.url, tokenizer="none", server_probe="off")))
        yield Peers(bg, origin, elsewhere, int(url.rsplit(":", 1)[1]))
    finally:
        bg.close()


@pytest.fixture
def p(peers: Peers) -> Iterator[Peers]:
    yield peers
    assert peers.elsewhere.raw == [] and peers.elsewhere.received() == b""  # never a connection there


def send(p: Peers, payload: bytes) -> tuple[Exchange, list]:
    before = len(p.origin.requests)
    got = p.bg.run(exchange(p.port, payload))
    return got, p.origin.requests[before:]


def test_absolute_form_target_goes_to_the_configured_upstream(p: Peers) -> None:
    for scheme in (b"http", b"https"):
        got, seen = send(
            p, b"GET %s://%s/v1/models?x=1 HTTP/1.1\r\nHost: %s\r\n\r\n" % (scheme, p.other, p.other)
        )
        assert [r.echo()["path"] for r in got.responses] == ["/v1/models?x=1", "/sentinel"]
        assert [s.header(b"host") for s in seen] == [[p.own], [p.own]]


def test_host_header_naming_another_host_changes_nothing(p: Peers) -> None:
    got, seen = send(p, b"GET /v1/models HTTP/1.1\r\nHost: %s\r\n\r\n" % p.other)
    assert got.responses[0].echo()["path"] == "/v1/models"
    assert seen[0].header(b"host") == [p.own]


def test_two_host_headers_are_refused(p: Peers) -> None:
    """RFC 9112 3.2: more than one Host field line is a 400."""
    got, seen = send(p, b"GET /v1/models HTTP/1.1\r\nHost: %s\r\nHost: %s\r\n\r\n" % (p.own, p.other))
    assert [r.status for r in got.responses] == [400] and got.closed
    assert seen == []


def test_connect_is_answered_by_the_proxy_never_tunnelled(p: Peers) -> None:
    """CONNECT has no path to relay: the proxy answers 404 itself, and what follows on the connection is
    read as HTTP again (the sentinel reaches the configured upstream), not as a tunnel's bytes."""
    got, seen = send(p, b"CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (p.other, p.other))
    assert [r.status for r in got.responses] == [404, 200]
    assert [s.target for s in seen] == ["/sentinel"]


@pytest.mark.parametrize("target", [b"@{other}/x", b".{other}/x", b":{other}/x", b"{other}/x"])
def test_targets_that_would_join_into_another_authority_are_refused(p: Peers, target: bytes) -> None:
    """The upstream URL is the configured base plus the target as sent; a target that does not start with
    "/" (origin-form, RFC 9112 3.2.1) would join into `base@host` or `base.host`: refused with 400."""
    t = target.replace(b"{other}", p.other)
    got, seen = send(p, b"GET %s HTTP/1.1\r\nHost: x\r\n\r\n" % t)
    assert [r.status for r in got.responses] == [400] and got.closed
    assert seen == []


def test_a_double_slash_path_is_a_path(p: Peers) -> None:
    got, seen = send(p, b"GET //%s/x HTTP/1.1\r\nHost: x\r\n\r\n" % p.other)
    assert got.responses[0].echo()["path"] == f"//{p.other.decode()}/x"
    assert seen[0].header(b"host") == [p.own]


def test_forwarding_headers_are_relayed_not_followed(p: Peers) -> None:
    fields = (
        b"X-Forwarded-Host: %s\r\nForwarded: host=%s;proto=http\r\nX-Forwarded-For: 10.0.0.1\r\n"
        b"X-Original-URL: http://%s/x\r\n" % (p.other, p.other, p.other)
    )
    got, seen = send(p, b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + fields + b"\r\n")
    assert got.responses[0].echo()["path"] == "/v1/models"
    assert seen[0].header(b"x-forwarded-host") == [p.other]  # relayed as sent: the upstream's to judge


def test_upgrade_is_not_tunnelled(p: Peers) -> None:
    """Upgrade and Connection are hop-by-hop (RFC 9110 7.6.1, 7.8): the request goes upstream as plain HTTP
    without them and its answer comes back; no tunnel opens. (aiohttp's parser reads nothing more on a
    connection after an Upgrade it does not handle, such as h2c: each probe has its own connection.)"""
    for proto in (b"websocket", b"h2c"):
        head = b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: %s\r\n" % proto
        if proto == b"websocket":
            head += b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
        before = len(p.origin.requests)
        got = p.bg.run(exchange(p.port, head + b"\r\n", sentinel=False))
        seen = p.origin.requests[before:]
        assert [r.status for r in got.responses] == [200] and got.responses[0].header(b"upgrade") == []
        assert [s.target for s in seen] == ["/v1/models"] and seen[0].header(b"upgrade") == []


def test_proxy_credentials_are_not_forwarded(p: Peers) -> None:
    got, seen = send(p, b"GET /v1/models HTTP/1.1\r\nHost: x\r\nProxy-Authorization: Basic dTpw\r\n\r\n")
    assert got.responses[0].status == 200
    assert seen[0].header(b"proxy-authorization") == []


def test_an_upstream_redirect_is_relayed_not_followed(p: Peers) -> None:
    location = b"http://%s/stolen" % p.other
    p.origin.replies.append(
        b"HTTP/1.1 307 Temporary Redirect\r\nLocation: %s\r\nContent-Length: 0\r\n\r\n" % location
    )
    got, _ = send(p, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
    assert got.responses[0].status == 307 and got.responses[0].header(b"location") == [location]


def test_proxy_environment_variables_are_ignored(p: Peers, monkeypatch: pytest.MonkeyPatch) -> None:
    """trust_env=False: HTTP_PROXY and friends never route the upstream call elsewhere."""
    for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(name, p.elsewhere.url)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    got, seen = send(p, b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
    assert got.responses[0].echo()["path"] == "/v1/models" and seen[0].header(b"host") == [p.own]
