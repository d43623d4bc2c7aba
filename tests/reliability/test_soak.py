"""A bounded soak: 20,000 mixed requests at concurrency 32 through `islwatch proxy` (a process, as operators
run it) to `islwatch emulate`, and 2,000 to a real llama-server, every answer compared with the direct
answer of the same upstream. Zero altered answers, zero proxy-made errors, and the proxy process's RSS and
open fds bounded (measured in /proc before and after).

Mixed: chat, completions, embeddings and responses; JSON and SSE; with and without usage; prompts of a
few bytes to 64 KB; the upstream's own errors (400, 404, 501). Compared byte for byte: the status, the
body, and every header except Date (per response: RFC 9110 6.6.1 has a proxy add one when the origin sent
none) and the hop-by-hop framing a proxy regenerates (Connection, Keep-Alive, Transfer-Encoding: RFC 9110
7.6.1). llama-server's generated text is deterministic here (temperature 0, a seed, one slot); the parts of
its answers that differ on every call (ids, `created`, `timings`, prompt-cache hits, and so the length)
are masked the same way on both sides before comparing.
"""

from __future__ import annotations

import asyncio
import random
import re
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from tests.conftest import TEST_TOKENIZERS, unavailable
from tests.eventually import eventually
from tests.interop import llama_server_proc as llama
from tests.reliability.reliability_peers import (
    Child,
    open_fds,
    rss_bytes,
    running,
    start_emulator,
    start_proxy,
    stop,
    tcp_peers,
)
from tests.server.helpers import parse_metrics, value

SOAK = 20_000
WARMUP_FRACTION = 10  # 1/10 more first: pools, caches and the allocator reach their steady state
CONCURRENCY = 32
LLAMA_SOAK = 2_000  # llama-server generates one token per request on one slot: about 150 requests/s
LLAMA_CONCURRENCY = 16
# A leak of 1 KB per request would be 20 MB here; the proxy measured well under 1 MB (docs/faults.md).
RSS_GROWTH_MAX = 8 * 1024 * 1024
VOLATILE_HEADERS = frozenset({b"date", b"connection", b"keep-alive", b"transfer-encoding"})
PROXY_ERROR = b'{"error":{"message":"islwatch:'


@dataclass(frozen=True)
class Spec:
    """One request of the mix: method, path, body bytes, and how often it is drawn."""

    name: str
    method: str
    path: str
    body: bytes | None = None
    weight: int = 10


def _json(name: str, path: str, body: dict[str, Any], weight: int = 10) -> Spec:
    return Spec(name, "POST", path, orjson.dumps(body), weight)


def _chat(words: str, **extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": words}], **extra}


KB2 = "lorem ipsum dolor sit amet " * 76  # ~2 KB
KB64 = "the quick brown fox jumps over the lazy dog " * 1490  # ~64 KB
USAGE = {"stream": True, "stream_options": {"include_usage": True}}

# fmt: off
EMULATOR_MIX = [
    _json("chat-json", "/v1/chat/completions", _chat("Hi", max_tokens=1), 30),
    _json("chat-json-4", "/v1/chat/completions", _chat("Name three colours.", max_tokens=4)),
    _json("chat-json-2kb", "/v1/chat/completions", _chat(KB2, max_tokens=2)),
    _json("chat-json-64kb", "/v1/chat/completions", _chat(KB64, max_tokens=1), 1),
    _json("chat-sse", "/v1/chat/completions", _chat("Hi", max_tokens=3, stream=True), 20),
    _json("chat-sse-usage", "/v1/chat/completions", _chat("Hi", max_tokens=3, **USAGE), 20),
    _json("chat-sse-continuous", "/v1/chat/completions",
          _chat("Hi", max_tokens=2, stream=True,
                stream_options={"include_usage": True, "continuous_usage_stats": True})),
    _json("chat-sse-2kb", "/v1/chat/completions", _chat(KB2, max_tokens=2, **USAGE)),
    _json("completions-json", "/v1/completions", {"model": "m", "prompt": "Once", "max_tokens": 2}, 20),
    _json("completions-two", "/v1/completions", {"model": "m", "prompt": ["a", "b c"], "max_tokens": 1}),
    _json("completions-sse", "/v1/completions", {"model": "m", "prompt": "Once", "max_tokens": 3, "stream": True}),
    _json("completions-sse-usage", "/v1/completions", {"model": "m", "prompt": "Once", "max_tokens": 3, **USAGE}),
    _json("embeddings", "/v1/embeddings", {"model": "m", "input": "hello"}, 20),
    _json("embeddings-list", "/v1/embeddings", {"model": "m", "input": ["a", "b", KB2]}),
    _json("embeddings-base64", "/v1/embeddings", {"model": "m", "input": "x", "encoding_format": "base64"}),
    _json("responses-json", "/v1/responses", {"model": "m", "input": "Hi", "max_output_tokens": 2}),
    _json("responses-sse", "/v1/responses", {"model": "m", "input": "Hi", "max_output_tokens": 2, "stream": True}),
    _json("refused-n2", "/v1/chat/completions", _chat("Hi", n=2), 3),  # the emulator's 400
    Spec("refused-not-json", "POST", "/v1/chat/completions", b"{not json", 3),
    Spec("models", "GET", "/v1/models", None, 5),
    Spec("health", "GET", "/health", None, 5),
    Spec("not-found", "GET", "/v1/nothing-here", None, 2),  # the upstream's 404
]
# fmt: on


def _deterministic(**extra: Any) -> dict[str, Any]:
    return {"temperature": 0, "seed": 7, **extra}


# fmt: off
LLAMA_MIX = [
    _json("chat-json", "/v1/chat/completions", _chat("Hi", max_tokens=1, **_deterministic()), 30),
    _json("chat-json-2kb", "/v1/chat/completions", _chat(KB2, max_tokens=1, **_deterministic()), 3),
    _json("chat-sse", "/v1/chat/completions", _chat("Hi", max_tokens=1, stream=True, **_deterministic()), 20),
    _json("chat-sse-usage", "/v1/chat/completions", _chat("Hi", max_tokens=1, **USAGE, **_deterministic()), 20),
    _json("completions-json", "/v1/completions", {"prompt": "Once", "max_tokens": 1, **_deterministic()}, 10),
    _json("completions-sse", "/v1/completions", {"prompt": "Once", "max_tokens": 1, **_deterministic(), **USAGE}, 10),
    _json("embeddings-501", "/v1/embeddings", {"input": "hello"}, 3),  # not started with --embeddings
    _json("tokenize", "/tokenize", {"content": "Hello world"}, 5),
    Spec("models", "GET", "/v1/models", None, 3),
    Spec("health", "GET", "/health", None, 3),
]
# fmt: on

_LLAMA_VOLATILE = [
    (re.compile(rb'"id":"chatcmpl-[A-Za-z0-9]+"'), b'"id":"chatcmpl-X"'),
    (re.compile(rb'"created":\d+'), b'"created":0'),
    (re.compile(rb'"timings":\{[^{}]*\}'), b'"timings":{}'),
    (re.compile(rb'"cached_tokens":\d+'), b'"cached_tokens":0'),
]


def mask_llama(body: bytes) -> bytes:
    for pattern, fixed in _LLAMA_VOLATILE:
        body = pattern.sub(fixed, body)
    return body


Fingerprint = tuple[int, tuple[tuple[bytes, bytes], ...], bytes]


def fingerprint(status: int, headers: Any, body: bytes, masked: bool) -> Fingerprint:
    drop = VOLATILE_HEADERS | ({b"content-length"} if masked else set())
    kept = tuple((k, v) for k, v in headers if k.lower() not in drop)
    return status, kept, mask_llama(body) if masked else body


@dataclass
class Tally:
    sent: int = 0
    identical: int = 0
    altered: list[str] = field(default_factory=list)
    proxy_errors: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return f"{self.sent} sent, altered {self.altered[:5]}, proxy-made errors {self.proxy_errors[:5]}"


async def fetch(session: aiohttp.ClientSession, base: str, spec: Spec, masked: bool) -> Fingerprint:
    headers = {"Content-Type": "application/json", "Authorization": "Bearer soak"} if spec.body else {}
    async with session.request(spec.method, base + spec.path, data=spec.body, headers=headers) as r:
        return fingerprint(r.status, r.raw_headers, await r.read(), masked)


def session(concurrency: int, fresh: bool = False) -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(limit=concurrency, force_close=fresh)
    return aiohttp.ClientSession(connector=connector, auto_decompress=False)


async def direct_answers(base: str, mix: list[Spec], masked: bool) -> dict[str, Fingerprint]:
    """Each spec's direct answer, asked twice: the comparison stands only if the upstream repeats itself.
    A new connection each time: llama-server closes a kept-alive connection after a stream, and a client
    reusing it races that close (the race the proxy itself retries; docs/faults.md)."""
    out: dict[str, Fingerprint] = {}
    async with session(1, fresh=True) as s:
        for spec in mix:
            first, second = await fetch(s, base, spec, masked), await fetch(s, base, spec, masked)
            assert first == second, f"{spec.name}: the upstream's direct answers differ: {first} {second}"
            out[spec.name] = first
    return out


async def soak(
    base: str, plan: list[Spec], expected: dict[str, Fingerprint], masked: bool, concurrency: int
) -> Tally:
    tally = Tally()
    todo: Iterator[Spec] = iter(plan)

    async def client(s: aiohttp.ClientSession) -> None:
        for spec in todo:  # one shared iterator: each request is sent exactly once
            tally.sent += 1
            try:
                got = await fetch(s, base, spec, masked)
            except (aiohttp.ClientError, TimeoutError) as exc:
                tally.proxy_errors.append(f"{spec.name}: {type(exc).__name__}: {exc}")
                continue
            if got == expected[spec.name]:
                tally.identical += 1
            elif got[2].startswith(PROXY_ERROR):
                tally.proxy_errors.append(f"{spec.name}: {got[0]} {got[2][:200]!r}")
            else:
                tally.altered.append(f"{spec.name}: got {got!r:.600} want {expected[spec.name]!r:.600}")

    async with session(concurrency) as s:
        await asyncio.gather(*(client(s) for _ in range(concurrency)))
    return tally


def draw(mix: list[Spec], n: int, seed: int) -> list[Spec]:
    return random.Random(seed).choices(mix, weights=[s.weight for s in mix], k=n)


@dataclass(frozen=True)
class ProcState:
    rss: int
    fds: int
    upstream_conns: int

    @property
    def other_fds(self) -> int:
        """Every fd but the pooled upstream connections (no client is connected when this is read)."""
        return self.fds - self.upstream_conns


def quiet_state(proxy: Child, upstream_port: int) -> ProcState:
    """The proxy's RSS and fds once every client connection is gone (the client closed them: the proxy
    sees EOF at once; waiting on that event, not on time)."""
    pid = proxy.proc.pid
    eventually(lambda: tcp_peers(pid, proxy.port, local=True), until=lambda n: n == 0,
               what="the proxy closing its client connections")  # fmt: skip
    return ProcState(rss_bytes(pid), open_fds(pid), tcp_peers(pid, upstream_port))


def scrape(admin_url: str) -> dict[Any, float]:
    with urllib.request.urlopen(admin_url + "/metrics", timeout=10) as r:
        return parse_metrics(r.read().decode())


@dataclass(frozen=True)
class Run:
    warmup: Tally
    tally: Tally
    before: ProcState
    after: ProcState
    metrics: dict[Any, float]
    upstream_port: int


def run_soak(
    proxy: Child, upstream: str, upstream_port: int, mix: list[Spec], n: int, concurrency: int, masked: bool
) -> Run:
    expected = asyncio.run(direct_answers(upstream, mix, masked))
    warmup = asyncio.run(soak(proxy.url, draw(mix, n // WARMUP_FRACTION, 1), expected, masked, concurrency))
    before = quiet_state(proxy, upstream_port)
    tally = asyncio.run(soak(proxy.url, draw(mix, n, 2), expected, masked, concurrency))
    after = quiet_state(proxy, upstream_port)
    print(
        f"\nsoak {upstream}: {tally.sent} requests at concurrency {concurrency} (+{warmup.sent} warm-up): "
        f"{tally.identical} identical, {len(tally.altered)} altered, {len(tally.proxy_errors)} proxy-made "
        f"errors; proxy RSS {before.rss / 2**20:.2f} -> {after.rss / 2**20:.2f} MiB, fds {before.fds} -> "
        f"{after.fds} ({before.upstream_conns} -> {after.upstream_conns} pooled upstream connections)"
    )
    return Run(warmup, tally, before, after, scrape(proxy.admin_url), upstream_port)


def check(run: Run, n: int, concurrency: int, proxy: Child) -> None:
    warmup = n // WARMUP_FRACTION
    for tally, count in ((run.warmup, warmup), (run.tally, n)):
        assert tally.sent == count and tally.identical == count, tally.summary()
    assert value(run.metrics, "islwatch_requests_total") == warmup + n
    for kind in ("connect", "timeout", "reset"):  # status_5xx: the upstream's own 5xx (llama-server's 501)
        assert value(run.metrics, "islwatch_upstream_errors_total", kind=kind) == 0, kind
    assert run.after.rss - run.before.rss <= RSS_GROWTH_MAX, (run.before, run.after)
    # The pool is bounded by the load; +2: the server parity probe's and the /readyz health check's own
    # connections to the same port.
    assert run.after.upstream_conns <= concurrency + 2, run.after
    # Every other fd (listeners, pipes to the workers, the event loop's) is back to its count: no leak.
    pid = proxy.proc.pid
    eventually(lambda: open_fds(pid) - tcp_peers(pid, run.upstream_port), until=lambda n: n <= run.before.other_fds,
               what="the proxy's non-upstream fds back to their count")  # fmt: skip


@pytest.fixture(scope="module")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Child]:
    with running(start_emulator(tmp_path_factory.mktemp("soak") / "emulate.log")) as child:
        yield child


@pytest.mark.slow  # the soak: minutes of load
def test_soak_against_the_emulator(emulator: Child, tmp_path: Path) -> None:
    with running(start_proxy(emulator.url, tmp_path / "proxy.log")) as proxy:
        run = run_soak(proxy, emulator.url, emulator.port, EMULATOR_MIX, SOAK, CONCURRENCY, masked=False)
        check(run, SOAK, CONCURRENCY, proxy)
        # Under load the proxy still counts as the emulator does: once every analysis is done (or dropped,
        # counted, when the queue was full), none disagrees.
        m = eventually(lambda: scrape(proxy.admin_url), until=lambda m: value(m, "islwatch_analysis_queue_depth") == 0,
                       what="the analysis queue drained")  # fmt: skip
        assert value(m, "islwatch_isl_match_total", result="mismatch") == 0
        assert value(m, "islwatch_isl_match_total", result="exact") > 0
        stop(proxy)
        assert proxy.proc.returncode == 0, proxy.log_tail()


@pytest.mark.llama_server
def test_soak_against_llama_server(tmp_path: Path, llama_server: tuple[str, int]) -> None:
    url, port = llama_server
    tokenizer = str(TEST_TOKENIZERS / "qwen2.5-instruct")
    args = ("--tokenizer", tokenizer, "--server-flavor", "llama.cpp")
    with running(start_proxy(url, tmp_path / "proxy.log", *args)) as proxy:
        run = run_soak(proxy, url, port, LLAMA_MIX, LLAMA_SOAK, LLAMA_CONCURRENCY, masked=True)
        check(run, LLAMA_SOAK, LLAMA_CONCURRENCY, proxy)


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    gguf = llama.tiny_gguf("qwen2.5-instruct")
    try:
        binary = llama.find_binary()
    except llama.BinaryUnavailable as exc:
        unavailable(str(exc))
    port = llama.free_port()
    log = tmp_path_factory.mktemp("llama") / "llama-server.log"
    proc = llama.launch(binary, gguf, port, log)  # one slot, one thread: answers are deterministic
    try:
        llama.wait_healthy(proc, f"http://127.0.0.1:{port}", log)
        yield f"http://127.0.0.1:{port}", port
    finally:
        llama.stop(proc)
