"""Test helpers for the proxy: a background event loop that hosts real servers for a whole test module,
a small real upstream with switchable behaviours (replaying recorded llama-server bytes, faults), the
recorded fixtures, and /metrics parsing.

For other engineers: the in-process proxy is `proxy.app.run_proxy(config)` (an async context manager
yielding `(url, admin_url, admin_app)`); `proxy_config(upstream, **overrides)` below builds a config on free
ports. `Background` runs such context managers in a thread so tests in any event loop can use them.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import orjson
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from proxy.server.config import ProxyConfig, load_config
from tests.eventually import eventually_async

T = TypeVar("T")
FIXED_DATE = "Mon, 30 Nov 2026 12:00:00 GMT"  # so direct and proxied answers are byte-identical


def proxy_config(upstream: str, **overrides: Any) -> ProxyConfig:
    """A proxy config on free ports, thread-mode analysis (no process start-up) unless overridden."""
    values: dict[str, Any] = {
        "upstream": upstream,
        "listen": "127.0.0.1:0",
        "admin": "127.0.0.1:0",
        "analysis_mode": "thread",
        **overrides,
    }
    return load_config(values, env={})


class Background:
    """An event loop in a thread: servers started here outlive any one test's loop."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="test-servers", daemon=True)
        self._thread.start()
        self._stack = contextlib.AsyncExitStack()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 180.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def enter(self, cm: contextlib.AbstractAsyncContextManager[T]) -> T:
        return self.run(self._stack.enter_async_context(cm))

    def call(self, fn: Callable[[], T]) -> T:
        async def wrapped() -> T:
            return fn()

        return self.run(wrapped())

    def close(self) -> None:
        self.run(self._stack.aclose())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(30)
        self.loop.close()


@contextlib.asynccontextmanager
async def serve_app(app: web.Application, **runner_kw: Any) -> Any:
    runner = web.AppRunner(app, access_log=None, handle_signals=False, **runner_kw)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


# ---- recorded llama-server responses ------------------------------------------------------------------

# Raw responses of a real llama-server (llama.cpp 0.5.0-dev, commit 0c1e570), committed: tests/data/llama-server.
FIXTURE_DIR = Path(__file__).resolve().parents[1] / "data" / "llama-server"


@dataclass(frozen=True)
class Recorded:
    name: str
    path: str
    request: bytes
    status: int
    headers: list[tuple[str, str]]
    body: bytes


def load_recorded(path: Path) -> Recorded:
    raw = path.read_bytes()
    head, _, body = raw.partition(b"\n\n")
    lines = head.decode().split("\n")
    method_path = lines[0].removeprefix("# request: ").split(" ", 1)[1]
    request = lines[1].removeprefix("# ").encode()
    status = int(lines[2].removeprefix("# status: "))
    headers = [tuple(line.split(": ", 1)) if ": " in line else (line.rstrip(":"), "") for line in lines[3:]]
    return Recorded(path.name.removesuffix(".http"), method_path, request, status, headers, body)  # type: ignore[arg-type]


def recorded_fixtures() -> list[Path]:
    return sorted(FIXTURE_DIR.glob("*.http"))


# ---- a real upstream with switchable behaviours -----------------------------------------------------------

MODE_HEADER = "X-Test-Upstream"


@dataclass
class UpstreamState:
    requests: list[dict[str, Any]]
    cancelled: int = 0
    gate: asyncio.Event | None = None  # set by a test to let "gated" streams continue
    # Set by a test once its client holds the first bytes of a "reset-*" answer: the upstream then cuts the
    # connection. (A reader that has not consumed those bytes when the connection dies loses them.)
    cut: asyncio.Event | None = None


def sse_events(include_usage: bool, null_usage: bool) -> list[bytes]:
    """An OpenAI-shaped chat stream: `"usage": null` on every chunk when include_usage (OpenAI does that),
    and a final chunk with empty choices carrying the usage."""
    base = {"id": "chatcmpl-fixed", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    events = []
    for i, piece in enumerate(["Hel", "lo", ""]):
        delta = {"content": piece} if piece else {}
        obj: dict[str, Any] = {
            **base,
            "choices": [{"index": 0, "delta": delta, "finish_reason": "stop" if i == 2 else None}],
        }
        if include_usage and null_usage:
            obj["usage"] = None
        events.append(b"data: " + orjson.dumps(obj) + b"\n\n")
    if include_usage:
        usage = {"prompt_tokens": 12, "completion_tokens": 2, "total_tokens": 14}
        events.append(b"data: " + orjson.dumps({**base, "choices": [], "usage": usage}) + b"\n\n")
    events.append(b"data: [DONE]\n\n")
    return events


def build_test_upstream(state: UpstreamState) -> web.Application:
    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        mode = request.headers.get(MODE_HEADER, "echo")
        state.requests.append(
            {
                "method": request.method,
                "path": request.path_qs,
                "headers": list(request.raw_headers),
                "body": body,
            }
        )
        if mode == "echo":
            echo = {
                "method": request.method,
                "path": request.raw_path,
                "headers": [[k.decode(), v.decode()] for k, v in request.raw_headers],
                "body_len": len(body),
                "usage": {"prompt_tokens": 1},
            }
            return web.Response(
                body=orjson.dumps(echo), content_type="application/json", headers={"Date": FIXED_DATE}
            )
        if mode.startswith("replay:"):
            rec = load_recorded(FIXTURE_DIR / (mode.removeprefix("replay:") + ".http"))
            resp = web.StreamResponse(status=rec.status)
            for k, v in rec.headers:
                if k.lower() not in ("transfer-encoding", "keep-alive", "content-length", "connection"):
                    resp.headers.add(k, v)
            resp.headers["Date"] = FIXED_DATE
            if not rec.headers or "event-stream" not in dict(rec.headers).get("Content-Type", ""):
                resp.content_length = len(rec.body)
            await resp.prepare(request)
            for event in rec.body.split(b"\n\n"):  # event by event, as the server wrote them
                if event:
                    await resp.write(event + b"\n\n")
            await resp.write_eof()
            return resp
        if mode.startswith("openai-sse"):
            parsed = orjson.loads(body)
            include = bool((parsed.get("stream_options") or {}).get("include_usage"))
            # ":always-null": a server that serialises SDK chunk objects sends `"usage": null` unasked.
            always_null = mode == "openai-sse:always-null"
            events = sse_events(include or always_null, null_usage=True)
            if always_null and not include:
                events = [*events[:-2], events[-1]]  # no usage-only chunk when not asked
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Date": FIXED_DATE})
            await resp.prepare(request)
            for event in events:
                await resp.write(event)
            await resp.write_eof()
            return resp
        if mode.startswith("status:"):
            code = int(mode.removeprefix("status:"))
            err = {"error": {"message": "overloaded", "type": "server_error", "code": code}}
            return web.Response(
                status=code,
                body=orjson.dumps(err),
                content_type="application/json",
                headers={"Date": FIXED_DATE, "Retry-After": "1"},
            )
        if mode == "no-usage":
            obj = {
                "id": "x",
                "object": "chat.completion",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}],
            }
            return web.Response(
                body=orjson.dumps(obj), content_type="application/json", headers={"Date": FIXED_DATE}
            )
        if mode in ("reset-stream", "reset-length"):
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Date": FIXED_DATE})
            if mode == "reset-length":
                resp.headers["Content-Type"] = "application/json"
                resp.content_length = 1000
            await resp.prepare(request)
            await resp.write(
                b'data: {"choices":[{"index":0,"delta":{"content":"a"}}]}\n\n'
                if mode == "reset-stream"
                else b'{"id":'
            )
            assert state.cut is not None
            # Bounded only so that a proxy which holds the bytes back fails its test instead of hanging it.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(state.cut.wait(), 120)
            assert request.transport is not None
            request.transport.abort()
            return resp
        if mode == "gated-stream":
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Date": FIXED_DATE})
            await resp.prepare(request)
            try:
                await resp.write(b'data: {"choices":[{"index":0,"delta":{"content":"first"}}]}\n\n')
                assert state.gate is not None
                await state.gate.wait()
                await resp.write(b'data: {"choices":[],"usage":{"prompt_tokens":7}}\n\n')
                await resp.write(b"data: [DONE]\n\n")
                await resp.write_eof()
            except (asyncio.CancelledError, ConnectionResetError):
                state.cancelled += 1
                raise
            return resp
        return web.Response(status=400, text=f"unknown test mode {mode}")

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_route("*", "/{tail:.*}", handle)
    return app


# ---- /metrics ---------------------------------------------------------------------------------------------


def parse_metrics(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    """Sum of the samples of `name` whose labels include `labels` (0 when none)."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)


async def fetch_metrics(session: Any, admin_url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    async with session.get(admin_url + "/metrics") as r:
        assert r.status == 200
        return parse_metrics(await r.text())


async def wait_metrics(
    session: Any, admin_url: str, check: Callable[[dict[Any, float]], bool], timeout: float = 60.0
) -> dict[Any, float]:
    """Poll /metrics until `check` holds (analysis is asynchronous by design). Not a timing assertion: the
    deadline only bounds a failing test, whose message shows the last non-zero islwatch samples."""
    return await eventually_async(
        lambda: fetch_metrics(session, admin_url),
        until=check,
        timeout=timeout,
        what=f"{admin_url}/metrics reaching the expected state",
        interval=0.02,
        describe=_islwatch_samples,
    )


def _islwatch_samples(samples: dict[Any, float]) -> str:
    return repr({k: v for k, v in samples.items() if k[0].startswith("islwatch") and v})[:3000]


def settled(samples: dict[Any, float]) -> bool:
    return value(samples, "islwatch_analysis_queue_depth") == 0
