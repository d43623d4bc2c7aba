"""`islwatch parity --server URL`: the server parity probes (core/probe.py) against a live server's `/tokenize`.

The same probes the proxy runs at start: fixed synthetic texts, tokenized by islwatch's tokenizer and by
the server (vLLM or llama.cpp `POST /tokenize`, proxy/server/server_probe.py), compared id by id. Three
verdicts: `pass` (every probe equal), `fail` (some differ) and `unknown` (the server has no usable
`/tokenize`, or could not be reached): unknown is never reported as a pass.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from proxy.core.probe import Probe, ProbeResult, compare, summary
from proxy.core.probe_set import our_ids, probes

PASS = "pass"
FAIL = "fail"
UNKNOWN = "unknown"
# Why a verdict is unknown.
NO_TOKENIZE = "no_tokenize"
UNREACHABLE = "unreachable"
EXIT_CODES = {PASS: 0, FAIL: 1, UNKNOWN: 2}


@dataclass(frozen=True)
class ProbeRow:
    """One probe: its text, both id lists (the server's None while unknown) and the comparison."""

    name: str
    text: str
    ours: tuple[int, ...]
    theirs: tuple[int, ...] | None
    result: ProbeResult | None


@dataclass(frozen=True)
class ServerParity:
    url: str
    model: str | None
    verdict: str  # PASS, FAIL or UNKNOWN
    reason: str | None  # for UNKNOWN: NO_TOKENIZE or UNREACHABLE
    detail: str | None  # what went wrong, for UNKNOWN
    shape: str | None  # the /tokenize request shape the server answered ("vllm", "llama.cpp")
    rows: tuple[ProbeRow, ...]

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.verdict]

    @property
    def results(self) -> list[ProbeResult]:
        return [r.result for r in self.rows if r.result is not None]

    def summary(self) -> str:
        """One line: the probe summary when compared, else why parity is unknown."""
        if self.verdict == UNKNOWN:
            return f"server parity unknown: {self.detail}"
        return summary(self.results)


def check_url(url: str) -> str | None:
    """None when `url` is an http(s) URL with a host; else what is wrong with it."""
    try:
        parts = urlsplit(url)
        port_ok = parts.port is None or parts.port > 0  # `.port` raises on a port out of range
    except ValueError:  # "http://[bad", "http://h:99999"
        parts, port_ok = None, False
    if parts is None or not port_ok or parts.scheme not in ("http", "https") or not parts.hostname:
        return f"--server must be an http:// or https:// URL with a host, not {url!r}"
    return None


def no_tokenize_detail(url: str, model: str | None) -> str:
    hint = "" if model is not None else "; a vLLM server may need --model"
    return (
        f"{url.rstrip('/')}/tokenize answered neither the vLLM nor the llama.cpp request shape "
        f"(no /tokenize, or it refused the request{hint}: the server's root URL is needed, without /v1)"
    )


def _rows(
    probe_set: list[Probe], ours: list[list[int]], theirs: list[list[int]] | None
) -> tuple[ProbeRow, ...]:
    if theirs is None:
        return tuple(
            ProbeRow(p.name, p.text, tuple(a), None, None) for p, a in zip(probe_set, ours, strict=True)
        )
    results = compare(probe_set, ours, theirs)
    return tuple(
        ProbeRow(p.name, p.text, tuple(a), tuple(b), r)
        for p, a, b, r in zip(probe_set, ours, theirs, results, strict=True)
    )


async def probe_server(tok: Any, url: str, model: str | None) -> ServerParity:
    """Run the probes of `tok` against the server at `url`. Never raises for what the server does: an
    unreachable server or one without `/tokenize` is an UNKNOWN verdict. aiohttp is imported here, so the
    report modules can use this module's dataclasses without it."""
    import aiohttp

    from proxy.server.server_probe import client_session, server_ids

    probe_set = probes(tok)
    ours = our_ids(tok, probe_set)
    try:
        async with client_session() as session:
            answer = await server_ids(session, url, model, [p.text for p in probe_set])
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        detail = f"cannot reach {url}: {type(exc).__name__}: {exc}".rstrip(": ")
        return ServerParity(url, model, UNKNOWN, UNREACHABLE, detail, None, _rows(probe_set, ours, None))
    if answer is None:
        detail = no_tokenize_detail(url, model)
        return ServerParity(url, model, UNKNOWN, NO_TOKENIZE, detail, None, _rows(probe_set, ours, None))
    shape, theirs = answer
    rows = _rows(probe_set, ours, theirs)
    verdict = PASS if all(r.result is not None and r.result.equal for r in rows) else FAIL
    return ServerParity(url, model, verdict, None, None, shape, rows)


def run_probe(tok: Any, url: str, model: str | None) -> ServerParity:
    """`probe_server` from synchronous code (the CLI)."""
    return asyncio.run(probe_server(tok, url, model))
