"""Field lines cross the proxy byte for byte: what aiohttp would otherwise change, and how it is kept.

aiohttp's parsers decode every field name and value as `bytes.decode("utf-8", "surrogateescape")`
(`_http_parser.pyx` `_process_header`, `find_header`), so a byte that is not UTF-8, such as the obs-text
`\\xe9` of `X-Bin: caf\\xe9` (RFC 9110 5.5), becomes a lone surrogate. Its writer then loses that byte: the C
serializer skips surrogates (`_http_writer.pyx` `_write_utf8`: "surogate pair, ignored") and the Python one
raises `UnicodeEncodeError` (`http_writer.py` `_py_serialize_headers`). No str reaches it as a lone byte
either: every code point is written as UTF-8, so `caf\\xe9` decoded as latin-1 would go out as `caf\\xc3\\xa9`.
Both the request (client side) and the response (server side) are written by `StreamWriter.write_headers`,
which looks up the module global `http_writer._serialize_headers` on each call, so `keep_received_bytes()`
puts there (through proxy/runtime/compat.py, at the proxy's start-up) the exact inverse of the parser's decoding. Its output equals aiohttp's for every head without
a surrogate (tests/reliability/test_header_fidelity.py holds that). A StreamResponse subclass could write
the response head alone, but the request head is built and written inside `ClientRequest.send`, with no
hook after serialization: without this, such a request could only be refused (400). Read in aiohttp 3.14.

Names: the parsers hand known names back in canonical case (`content-type` -> `Content-Type`), so the
lines to forward are taken from `raw_headers`, which keeps the bytes as sent.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from itertools import chain

from multidict import CIMultiDict, MultiDict

from proxy.runtime import compat

_AIOHTTP_SERIALIZE = compat.aiohttp_serialize_headers()  # aiohttp's own, also after keep_received_bytes()
# The control characters aiohttp's writers refuse (RFC 9110 5.5, RFC 9112 4: header injection), unchanged.
_FORBIDDEN = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


def _checked(text: str) -> str:
    if _FORBIDDEN.search(text) is not None:
        raise ValueError(
            "Forbidden control character detected in headers. Potential header injection attack."
        )
    return text


def serialize_head(status_line: str, headers: CIMultiDict[str]) -> bytes:
    """`http_writer._serialize_headers` keeping bytes: each str is encoded back into the bytes it was
    decoded from (`surrogateescape` is the inverse of the parser's decoding), anything else as UTF-8. A head
    without a surrogate (nearly all) is one aiohttp's own C serializer writes unchanged: it goes there."""
    try:
        (status_line + "".join(chain.from_iterable(headers.items()))).encode()
    except UnicodeEncodeError:
        return _serialize_with_bytes(status_line, headers)
    return _AIOHTTP_SERIALIZE(status_line, headers)


def _serialize_with_bytes(status_line: str, headers: CIMultiDict[str]) -> bytes:
    lines = [_checked(status_line)]
    lines.extend(f"{_checked(name)}: {_checked(value)}" for name, value in headers.items())
    return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8", "surrogateescape")


def keep_received_bytes() -> None:
    """Make every head this process writes keep the bytes its parser read (idempotent). Called by the
    proxy's start-up (app.start_servers), never on import: importing islwatch changes no library."""
    compat.replace_serialize_headers(serialize_head)


def decoded(raw: Iterable[tuple[bytes, bytes]]) -> list[tuple[str, str]]:
    """`raw_headers` as aiohttp decodes them, but with each name as it was sent."""
    return [(n.decode("utf-8", "surrogateescape"), v.decode("utf-8", "surrogateescape")) for n, v in raw]


class FieldName(str):
    """A field name that compares and hashes case-insensitively (RFC 9110 5.1: names are case-insensitive).

    `ClientSession._prepare_headers` (client.py) keeps each name it has seen in a plain `set[str]` and
    assigns (`result[key] = value`, replacing every case variant already added) the first time it sees a
    spelling, so `X-B: 1` followed by `x-b: 2` would reach the upstream as `x-b: 2` alone. With these keys
    the second spelling is found in that set and added, and both lines go out in order, each as spelled.
    The merged headers aiohttp goes on with are a CIMultiDict of its own keys: this equality stays here.
    """

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, str) and self.lower() == other.lower()

    def __hash__(self) -> int:
        return hash(self.lower())


def for_client(fields: list[tuple[str, str]]) -> MultiDict[str]:
    """Headers for `ClientSession.request` that it sends as given: every line, in order and spelling (a
    case-sensitive MultiDict, so aiohttp iterates these very keys). FieldName keys only when two names
    differ in case alone: otherwise aiohttp's own handling already sends each line as spelled."""
    if len({name.lower() for name, _ in fields}) == len(fields):
        return MultiDict(fields)
    return MultiDict((FieldName(name), value) for name, value in fields)
