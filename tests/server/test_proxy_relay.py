"""The data path end to end: real upstreams (the emulator, a small switchable aiohttp server replaying real
llama-server bytes), the real proxy, real clients (aiohttp, the openai package, curl). Responses through the
proxy are byte-identical to direct ones; every bad input and fault is relayed faithfully, counted, logged in
one line without content, and the proxy keeps serving."""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import openai
import orjson
import pytest
from yarl import URL

from proxy.emulator.app import EmulatorConfig, build_emulator_app
from proxy.server.app import run_proxy
from tests.conftest import load_builtin
from tests.eventually import eventually_async
from tests.server.helpers import (
    MODE_HEADER,
    Background,
    UpstreamState,
    build_test_upstream,
    fetch_metrics,
    load_recorded,
    proxy_config,
    recorded_fixtures,
    serve_app,
    settled,
    value,
    wait_metrics,
)

SECRET = "zebra-orchid-7731"  # appears in prompts; must never appear in logs
CHAT = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": f"Say hello. {SECRET}"}]}
HOP = {"transfer-encoding", "connection", "keep-alive", "date"}  # date: two requests, two clocks


@dataclass
class Servers:
    emulator: str
    upstream: str
    state: UpstreamState
    plain: Any  # ProxyURLs -> emulator
    inject: Any  # ProxyURLs -> emulator, --inject-stream-usage
    faults: Any  # ProxyURLs -> test upstream, inject on, small body limit, a model map
    down: Any  # ProxyURLs -> a closed port
    bg: Background


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def servers() -> Iterator[Servers]:
    bg = Background()
    tok = load_builtin()
    emulator = bg.enter(serve_app(build_emulator_app(EmulatorConfig(), tokenizer=tok)))
    state = UpstreamState(requests=[])
    state.gate = bg.call(asyncio.Event)
    state.cut = bg.call(asyncio.Event)
    # handler_cancellation: like vLLM, the upstream notices a closed connection (and stops generating).
    upstream = bg.enter(serve_app(build_test_upstream(state), handler_cancellation=True))
    plain = bg.enter(run_proxy(proxy_config(emulator)))
    inject = bg.enter(run_proxy(proxy_config(emulator, inject_stream_usage=True)))
    faults = bg.enter(
        run_proxy(
            proxy_config(
                upstream,
                inject_stream_usage=True,
                max_body_bytes=4096,
                model_tokenizers={"known": "builtin:mistral-v0.1"},
            )
        )
    )
    down = bg.enter(run_proxy(proxy_config(f"http://127.0.0.1:{_closed_port()}", tokenizer="none")))
    try:
        yield Servers(emulator, upstream, state, plain, inject, faults, down, bg)
    finally:
        bg.close()


async def _fetch(session: aiohttp.ClientSession, method: str, url: str, **kw: Any) -> tuple[int, list, bytes]:
    async with session.request(method, url, **kw) as r:
        body = await r.read()
        headers = [
            (k.decode().lower(), v.decode()) for k, v in r.raw_headers if k.decode().lower() not in HOP
        ]
        return r.status, headers, body


async def _same(session: aiohttp.ClientSession, direct: str, proxied: str, path: str, **kw: Any) -> bytes:
    a = await _fetch(session, kw.pop("method", "POST"), direct + path, **kw)
    b = await _fetch(session, kw.pop("method", "POST") if "method" in kw else "POST", proxied + path, **kw)
    assert a == b
    return a[2]


# ---- byte identity ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", CHAT),
        ("/v1/chat/completions", {**CHAT, "stream": True}),
        ("/v1/chat/completions", {**CHAT, "stream": True, "stream_options": {"include_usage": True}}),
        ("/v1/completions", {"model": "m", "prompt": "The sky is", "max_tokens": 3}),
        (
            "/v1/completions",
            {
                "model": "m",
                "prompt": "The sky is",
                "max_tokens": 3,
                "stream": True,
                "stream_options": {"include_usage": True},
            },
        ),
        ("/v1/embeddings", {"model": "m", "input": ["one", "two words"]}),
        ("/v1/responses", {"model": "m", "input": "Hi there", "max_output_tokens": 3}),
        ("/v1/responses", {"model": "m", "input": "Hi there", "max_output_tokens": 3, "stream": True}),
    ],
)
async def test_emulator_responses_are_byte_identical_and_counted_exactly(
    servers: Servers, path, body
) -> None:
    async with aiohttp.ClientSession() as s:
        before = await fetch_metrics(s, servers.plain.admin_url)
        await _same(
            s,
            servers.emulator,
            servers.plain.url,
            path,
            data=orjson.dumps(body),
            headers={"Content-Type": "application/json"},
        )
        endpoint = {
            "/v1/chat/completions": "chat",
            "/v1/completions": "completions",
            "/v1/embeddings": "embeddings",
            "/v1/responses": "responses",
        }[path]
        key = {"model": "default", "endpoint": endpoint}
        after = await wait_metrics(
            s,
            servers.plain.admin_url,
            lambda m: (
                settled(m)
                and value(m, "islwatch_isl_match_total", **key)
                > value(before, "islwatch_isl_match_total", **key)
            ),
        )
        streamed_without_usage = (
            body.get("stream") and path != "/v1/responses" and "stream_options" not in body
        )
        result = "no_server_count" if streamed_without_usage else "exact"
        assert value(after, "islwatch_isl_match_total", result=result, **key) == 1 + value(
            before, "islwatch_isl_match_total", result=result, **key
        )
        assert value(after, "islwatch_requests_total", status_class="2xx", **key) > value(
            before, "islwatch_requests_total", status_class="2xx", **key
        )


async def test_recorded_llama_server_bytes_relay_unchanged(servers: Servers) -> None:
    async with aiohttp.ClientSession() as s:
        for path in recorded_fixtures():
            rec = load_recorded(path)
            headers = {MODE_HEADER: f"replay:{rec.name}", "Content-Type": "application/json"}
            body = await _same(
                s, servers.upstream, servers.faults.url, rec.path, data=rec.request, headers=headers
            )
            assert body == rec.body


async def test_openai_client_streaming_and_not(servers: Servers) -> None:
    results = []
    for base in (servers.emulator, servers.plain.url):
        client = openai.AsyncOpenAI(base_url=base + "/v1", api_key="test", max_retries=0)
        full = await client.chat.completions.create(model="m", messages=CHAT["messages"], max_tokens=4)
        chunks = [
            c.model_dump()
            async for c in await client.chat.completions.create(
                model="m",
                messages=CHAT["messages"],
                max_tokens=4,
                stream=True,
                stream_options={"include_usage": True},
            )
        ]
        await client.close()
        results.append((full.model_dump(), chunks))
    assert results[0] == results[1]
    assert results[1][0]["usage"]["prompt_tokens"] == results[1][1][-1]["usage"]["prompt_tokens"] > 0


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl not installed")
async def test_curl_stream_byte_identical(servers: Servers) -> None:
    # Chunk framing is hop-by-hop (Transfer-Encoding), so curl decodes it; headers and body must match.
    def curl(base: str) -> bytes:
        body = orjson.dumps({**CHAT, "stream": True})
        out = subprocess.run(
            [
                "curl",
                "-sS",
                "-N",
                "-i",
                "-H",
                "Content-Type: application/json",
                "--data-binary",
                "@-",
                base + "/v1/chat/completions",
            ],
            input=body,
            capture_output=True,
            check=True,
            timeout=60,
        ).stdout
        head, _, rest = out.partition(b"\r\n\r\n")
        kept = [h for h in head.split(b"\r\n") if not h.lower().startswith((b"date:", b"transfer-encoding:"))]
        return b"\r\n".join(kept) + b"\r\n\r\n" + rest

    direct, proxied = await asyncio.gather(
        asyncio.to_thread(curl, servers.emulator), asyncio.to_thread(curl, servers.plain.url)
    )
    assert direct == proxied and b"data: [DONE]" in proxied


# ---- forwarding -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE", "PATCH", "POST"])
async def test_every_method_and_path_reaches_the_configured_upstream_only(
    servers: Servers, method: str
) -> None:
    headers = {
        MODE_HEADER: "echo",
        "X-Custom": "kept",
        "Connection": "keep-alive, X-Hop",
        "X-Hop": "dropped",
        "Authorization": "Bearer sk-test",
    }
    url = "/some/other/path?q=a%2Fb&x=1"
    data = b"\x00\x01raw bytes" if method != "GET" else None
    async with aiohttp.ClientSession() as s:
        target = URL(servers.faults.url + url, encoded=True)
        status, _, body = await _fetch(s, method, target, headers=headers, data=data)
    assert status == 200
    echo = orjson.loads(body)
    assert echo["method"] == method and echo["path"] == url
    names = {k.lower(): v for k, v in echo["headers"]}
    assert names["x-custom"] == "kept" and names["authorization"] == "Bearer sk-test"
    assert ("x-hop" not in names and "connection" not in names) or names.get(
        "connection"
    ) != "keep-alive, X-Hop"
    assert names["host"] == servers.upstream.removeprefix("http://")
    assert echo["body_len"] == (len(data) if data else 0)
    assert "user-agent" in names  # aiohttp's client sent one; the proxy forwarded it, added no other


async def test_absolute_form_target_does_not_make_an_open_proxy(servers: Servers) -> None:
    host, port = servers.faults.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(
        b"GET http://example.invalid/steal?x=1 HTTP/1.1\r\nHost: example.invalid\r\n"
        b"X-Test-Upstream: echo\r\nConnection: close\r\n\r\n"
    )
    await writer.drain()
    raw = await reader.read()
    writer.close()
    assert raw.startswith(b"HTTP/1.1 200")
    echo = orjson.loads(raw.partition(b"\r\n\r\n")[2])
    assert echo["path"] == "/steal?x=1"  # served by the configured upstream, whatever the target said


async def server_tokens_counted(s: aiohttp.ClientSession, admin_url: str, before: dict) -> float:
    """Wait for the next analysed server count; the server tokens it added."""
    after = await wait_metrics(
        s,
        admin_url,
        lambda m: (
            value(m, "islwatch_isl_tokens_count", kind="server")
            > value(before, "islwatch_isl_tokens_count", kind="server")
        ),
    )
    return value(after, "islwatch_isl_tokens_sum", kind="server") - value(
        before, "islwatch_isl_tokens_sum", kind="server"
    )


async def test_relays_chunk_by_chunk_not_buffered(servers: Servers) -> None:
    servers.bg.call(servers.state.gate.clear)
    async with aiohttp.ClientSession() as s:
        before = await fetch_metrics(s, servers.faults.admin_url)
        async with s.post(
            servers.faults.url + "/v1/chat/completions",
            json={**CHAT, "stream": True, "stream_options": {"include_usage": True}},
            headers={MODE_HEADER: "gated-stream"},
        ) as r:
            first = await r.content.readuntil(b"\n\n")  # arrives while the upstream still holds the rest
            assert b"first" in first
            servers.bg.call(servers.state.gate.set)
            rest = await r.read()
        assert rest.endswith(b"data: [DONE]\n\n")
        assert await server_tokens_counted(s, servers.faults.admin_url, before) == 7


# aiohttp's client accepts gzip unless told otherwise; the proxy asks the upstream for identity when it asks
# for usage, so the direct request asks for identity too (as curl does by default) to compare the answers.
IDENTITY = {"Content-Type": "application/json", "Accept-Encoding": "identity"}


@pytest.mark.parametrize("mode", ["openai-sse", "openai-sse:always-null"])
async def test_inject_stream_usage_client_stream_unchanged(servers: Servers, mode: str) -> None:
    """The usage-only event is taken out; a server's `"usage": null` on every chunk is left as sent (OpenAI
    adds it only when asked, which cannot be told from a server that always sends it)."""
    body = orjson.dumps({**CHAT, "stream": True})
    async with aiohttp.ClientSession() as s:
        before = await fetch_metrics(s, servers.faults.admin_url)
        headers = {MODE_HEADER: mode, **IDENTITY}
        direct = await _fetch(
            s, "POST", servers.upstream + "/v1/chat/completions", data=body, headers=headers
        )
        proxied = await _fetch(
            s, "POST", servers.faults.url + "/v1/chat/completions", data=body, headers=headers
        )
        sent = orjson.loads(servers.state.requests[-1]["body"])
        assert sent["stream_options"] == {"include_usage": True}  # asked upstream ...
        assert b'"choices":[]' not in proxied[2]  # ... and the usage-only event taken out again
        if mode == "openai-sse:always-null":
            assert direct == proxied
        else:
            assert proxied[:2] == direct[:2]
            assert proxied[2].replace(b',"usage":null', b"") == direct[2]
        assert await server_tokens_counted(s, servers.faults.admin_url, before) == 12


async def test_inject_stream_usage_against_the_emulator(servers: Servers) -> None:
    body = orjson.dumps({**CHAT, "stream": True})
    async with aiohttp.ClientSession() as s:
        before = await fetch_metrics(s, servers.inject.admin_url)
        direct = await _fetch(
            s, "POST", servers.emulator + "/v1/chat/completions", data=body, headers=IDENTITY
        )
        proxied = await _fetch(
            s, "POST", servers.inject.url + "/v1/chat/completions", data=body, headers=IDENTITY
        )
        after = await wait_metrics(
            s,
            servers.inject.admin_url,
            lambda m: (
                settled(m)
                and value(m, "islwatch_isl_match_total", result="exact")
                > value(before, "islwatch_isl_match_total", result="exact")
            ),
        )
    # The client's stream is exactly what it would have been without the injection.
    assert direct == proxied
    assert value(after, "islwatch_isl_match_total", result="no_server_count") == value(
        before, "islwatch_isl_match_total", result="no_server_count"
    )
    assert value(after, "islwatch_stream_usage_injections_total", result="stripped") == 1 + value(
        before, "islwatch_stream_usage_injections_total", result="stripped"
    )


# ---- bad input and faults -----------------------------------------------------------------------------------

BAD = [
    ("invalid_json", b'{"model": "m", "messages": [', {"Content-Type": "application/json"}),
    (
        "non_utf8",
        b'{"model": "m", "messages": [{"role": "user", "content": "\xff\xfe"}]}',
        {"Content-Type": "application/json"},
    ),
    ("wrong_content_type", orjson.dumps(CHAT), {"Content-Type": "text/plain"}),
    ("not_a_request", b'["a", "list"]', {"Content-Type": "application/json"}),
    ("not_a_request", orjson.dumps({"model": "m", "prompt": SECRET}), {"Content-Type": "application/json"}),
    ("body_too_large", orjson.dumps({**CHAT, "pad": SECRET * 400}), {"Content-Type": "application/json"}),
    (
        "unknown_model",
        orjson.dumps({**CHAT, "model": "unheard-of-" + SECRET}),
        {"Content-Type": "application/json"},
    ),
]


@pytest.mark.parametrize(("reason", "body", "headers"), BAD, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
async def test_bad_requests_pass_through_counted_logged_once_without_content(
    servers: Servers, caplog: pytest.LogCaptureFixture, reason: str, body: bytes, headers: dict[str, str]
) -> None:
    caplog.set_level("DEBUG")
    async with aiohttp.ClientSession() as s:
        before = await fetch_metrics(s, servers.faults.admin_url)
        direct = await _fetch(
            s,
            "POST",
            servers.upstream + "/v1/chat/completions",
            data=body,
            headers={MODE_HEADER: "echo", **headers},
        )
        proxied = await _fetch(
            s,
            "POST",
            servers.faults.url + "/v1/chat/completions",
            data=body,
            headers={MODE_HEADER: "echo", **headers},
        )
        assert proxied[0] == direct[0] == 200
        assert orjson.loads(proxied[2])["body_len"] == len(body)  # relayed whole, byte for byte
        assert servers.state.requests[-1]["body"] == body
        after = await wait_metrics(
            s,
            servers.faults.admin_url,
            lambda m: (
                settled(m)
                and value(m, "islwatch_bad_requests_total", reason=reason)
                > value(before, "islwatch_bad_requests_total", reason=reason)
            ),
        )
        if (
            reason == "unknown_model"
        ):  # collapsed into one label value, still analysed with the default tokenizer
            assert value(after, "islwatch_requests_total", model="other") > value(
                before, "islwatch_requests_total", model="other"
            )
        # ... and the proxy keeps serving.
        ok = await _fetch(
            s, "POST", servers.faults.url + "/v1/chat/completions", json=CHAT, headers={MODE_HEADER: "echo"}
        )
        assert ok[0] == 200
    assert SECRET not in caplog.text
    assert len([r for r in caplog.records if r.getMessage().startswith(reason)]) <= 1


async def test_response_without_usage(servers: Servers) -> None:
    async with aiohttp.ClientSession() as s:
        before = await fetch_metrics(s, servers.faults.admin_url)
        await _same(
            s,
            servers.upstream,
            servers.faults.url,
            "/v1/chat/completions",
            json=CHAT,
            headers={MODE_HEADER: "no-usage"},
        )
        await wait_metrics(
            s,
            servers.faults.admin_url,
            lambda m: (
                settled(m)
                and value(m, "islwatch_isl_match_total", result="no_server_count")
                > value(before, "islwatch_isl_match_total", result="no_server_count")
            ),
        )


async def test_upstream_5xx_passed_through_and_counted(servers: Servers) -> None:
    async with aiohttp.ClientSession() as s:
        before = await fetch_metrics(s, servers.faults.admin_url)
        body = await _same(
            s,
            servers.upstream,
            servers.faults.url,
            "/v1/chat/completions",
            json=CHAT,
            headers={MODE_HEADER: "status:503"},
        )
        assert b"overloaded" in body
        after = await fetch_metrics(s, servers.faults.admin_url)
    assert value(after, "islwatch_upstream_errors_total", kind="status_5xx") == 1 + value(
        before, "islwatch_upstream_errors_total", kind="status_5xx"
    )
    assert value(after, "islwatch_requests_total", status_class="5xx") == 1 + value(
        before, "islwatch_requests_total", status_class="5xx"
    )


async def test_upstream_down_gives_502_json(servers: Servers, caplog: pytest.LogCaptureFixture) -> None:
    async with aiohttp.ClientSession() as s:
        for _ in range(2):
            async with s.post(servers.down.url + "/v1/chat/completions", json=CHAT) as r:
                assert r.status == 502
                err = (await r.json())["error"]
                assert err["code"] == "connect" and "upstream" in err["message"]
        m = await fetch_metrics(s, servers.down.admin_url)
        assert value(m, "islwatch_upstream_errors_total", kind="connect") == 2
        client = openai.AsyncOpenAI(base_url=servers.down.url + "/v1", api_key="x", max_retries=0)
        with pytest.raises(openai.InternalServerError):
            await client.chat.completions.create(model="m", messages=CHAT["messages"])
        await client.close()
    assert SECRET not in caplog.text


@pytest.mark.parametrize("mode", ["reset-stream", "reset-length"])
async def test_upstream_reset_mid_response_reaches_the_client_as_the_same_failure(
    servers: Servers, mode: str
) -> None:
    cut = servers.state.cut
    assert cut is not None

    async def attempt(base: str) -> tuple[bytes, type[BaseException] | None]:
        servers.bg.call(cut.clear)
        got = b""
        async with (
            aiohttp.ClientSession() as s,
            s.post(
                base + "/v1/chat/completions", json={**CHAT, "stream": True}, headers={MODE_HEADER: mode}
            ) as r,
        ):
            try:
                async for chunk in r.content.iter_any():
                    got += chunk
                    servers.bg.call(cut.set)  # the client holds the first bytes: now the upstream dies
            except aiohttp.ClientPayloadError as exc:
                return got, type(exc)
        return got, None

    async with aiohttp.ClientSession() as s:
        before = await fetch_metrics(s, servers.faults.admin_url)
        direct = await attempt(servers.upstream)
        proxied = await attempt(servers.faults.url)
        after = await fetch_metrics(s, servers.faults.admin_url)
        assert direct == proxied and direct[1] is aiohttp.ClientPayloadError
        assert value(after, "islwatch_upstream_errors_total", kind="reset") == 1 + value(
            before, "islwatch_upstream_errors_total", kind="reset"
        )
        ok = await _fetch(
            s, "POST", servers.faults.url + "/v1/chat/completions", json=CHAT, headers={MODE_HEADER: "echo"}
        )
        assert ok[0] == 200


async def test_client_disconnect_mid_stream_cancels_upstream_and_leaks_no_task(servers: Servers) -> None:
    servers.bg.call(servers.state.gate.clear)
    before_cancelled = servers.state.cancelled
    baseline = servers.bg.call(lambda: len(asyncio.all_tasks(servers.bg.loop)))
    async with aiohttp.ClientSession() as s:
        before = await fetch_metrics(s, servers.faults.admin_url)
        r = await s.post(
            servers.faults.url + "/v1/chat/completions",
            json={**CHAT, "stream": True},
            headers={MODE_HEADER: "gated-stream"},
        )
        assert b"first" in await r.content.readuntil(b"\n\n")
        r.close()  # the client goes away mid-stream
        # The upstream sees its request cancelled, with no help from the gate.
        cancelled = await eventually_async(
            lambda: servers.state.cancelled,
            until=lambda n: n > before_cancelled,
            what="the upstream seeing its request cancelled",
        )
        assert cancelled == before_cancelled + 1
        # The analysis still got its record (no server count: the stream never finished).
        await wait_metrics(
            s,
            servers.faults.admin_url,
            lambda m: (
                settled(m)
                and value(m, "islwatch_isl_match_total", result="no_server_count")
                > value(before, "islwatch_isl_match_total", result="no_server_count")
            ),
        )
    await eventually_async(
        lambda: servers.bg.call(lambda: len(asyncio.all_tasks(servers.bg.loop))),
        until=lambda n: n <= baseline,
        what=f"the servers' loop back to at most {baseline} tasks",
    )
    assert servers.bg.call(lambda: len(asyncio.all_tasks(servers.bg.loop))) <= baseline


# ---- admin and metrics ------------------------------------------------------------------------------------


def _tokenizer_info(m: dict) -> list[dict[str, str]]:
    return [dict(ls) for (n, ls), v in m.items() if n == "islwatch_tokenizer_info" and v == 1]


async def test_health_and_readiness(servers: Servers) -> None:
    async with aiohttp.ClientSession() as s:
        async with s.get(servers.plain.admin_url + "/healthz") as r:
            assert r.status == 200
        async with s.get(servers.plain.admin_url + "/readyz") as r:
            assert r.status == 200 and (await r.json())["tokenizers"] == {"default": "loaded"}
        async with s.get(servers.down.admin_url + "/readyz") as r:  # no tokenizer at all: nothing to load
            assert r.status == 200


async def test_reload_of_unchanged_files_is_not_a_change(servers: Servers) -> None:
    async with aiohttp.ClientSession() as s:
        before = await fetch_metrics(s, servers.plain.admin_url)
        async with s.post(servers.plain.admin_url + "/reload") as r:
            assert r.status == 200 and (await r.json())["status"] == "reloaded"
        m = await fetch_metrics(s, servers.plain.admin_url)
    # Same files on disk: a reload is not a change.
    assert (
        value(m, "islwatch_tokenizer_changes_total", model="default")
        == value(before, "islwatch_tokenizer_changes_total", model="default")
        == 0
    )
    info = _tokenizer_info(m)  # one identity series, before and after the reload
    assert len(info) == 1 and info[0]["model"] == "default" and info[0]["tokenizer"] == "builtin:mistral-v0.1"
    assert len(info[0]["template_sha256"]) == 64 and len(info[0]["tokenizer_sha256"]) == 64
    assert _tokenizer_info(before) == info


async def test_metric_catalogue(servers: Servers) -> None:
    async with aiohttp.ClientSession() as s:
        # One chat of its own, analysed, so that the drift histogram has series whatever ran before.
        async with s.post(servers.plain.url + "/v1/chat/completions", json=CHAT) as r:
            assert r.status == 200
            await r.read()
        m = await wait_metrics(
            s, servers.plain.admin_url, lambda m: value(m, "islwatch_isl_drift_tokens_count") >= 1
        )
    info = _tokenizer_info(m)
    assert len(info) == 1 and info[0]["model"] == "default" and info[0]["tokenizer"] == "builtin:mistral-v0.1"
    assert value(m, "islwatch_parity_ok", model="default") == 1
    assert value(m, "islwatch_build_info") == 1
    names = {n for n, _ in m}
    for name in (
        "islwatch_analysis_seconds_count",
        "islwatch_analysis_dropped_total",
        "islwatch_analysis_queue_depth",
        "islwatch_isl_drift_tokens_bucket",
        "process_cpu_seconds_total",
    ):
        assert name in names
    buckets = {dict(ls)["le"] for (n, ls) in m if n == "islwatch_isl_drift_tokens_bucket"}
    assert {"-1.0", "0.0", "1.0", "10.0", "-10.0"} <= buckets
