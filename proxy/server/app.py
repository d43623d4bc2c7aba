"""Wiring: the traffic app (every path -> `handler.handle`) and the admin app (admin.py: /metrics, /healthz,
/readyz, POST /reload), the long-lived resources they share, and `run_proxy`, which runs both in-process.

The upstream `ClientSession` and the analysis pool are owned by `cleanup_ctx` generators (created on
start-up, closed on shutdown); shared state sits behind typed `web.AppKey`s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, NamedTuple

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry

from proxy.runtime import compat
from proxy.runtime.heap import freeze_startup_heap
from proxy.runtime.pooled import PoolMarkingConnector
from proxy.server.admin import POOL, build_admin, reload_tokenizers
from proxy.server.budget import BodyBudget
from proxy.server.config import ProxyConfig
from proxy.server.engine_metrics import EngineScraper
from proxy.server.guard import Guard, Limits, ServerLog, ensure_fd_limit
from proxy.server.handler import CONTEXT, FRESH_SESSION, SESSION, ProxyContext, handle
from proxy.server.headers import keep_received_bytes
from proxy.server.inspect import Policy
from proxy.server.metrics import build_metrics
from proxy.server.pool import AnalysisPool
from proxy.server.problems import ProblemLog
from proxy.server.records import DEFAULT_KEY, AnalysisSpec
from proxy.server.server_probe import ServerProbe
from proxy.server.upstream import KEEPALIVE_SECONDS, HeadLimits

log = logging.getLogger("islwatch.proxy")


def analysis_spec(config: ProxyConfig) -> AnalysisSpec:
    tokenizers = [(model, spec) for model, spec in config.model_tokenizers.items()]
    if config.default_tokenizer is not None:
        tokenizers.insert(0, (DEFAULT_KEY, config.default_tokenizer))
    return AnalysisSpec(
        tokenizers=tuple(tokenizers),
        chat_template=config.chat_template,
        trust_remote_code=config.trust_remote_code,
        dump_dir=config.dump_mismatches,
        dump_max=config.dump_max,
        server_flavor=config.server_flavor,
        mm_processor_kwargs=config.mm_processor_kwargs,
        trust_request_mm_kwargs=config.trust_request_mm_kwargs,
        default_chat_template_kwargs=dict(config.default_chat_template_kwargs),
        harmony_start_date=config.harmony_start_date,
        tokenizer_mode=config.tokenizer_mode,
        reasoning_parser=config.reasoning_parser,
        nice=config.analysis_nice,
    )


def build_apps(
    config: ProxyConfig, registry: CollectorRegistry | None = None
) -> tuple[web.Application, web.Application]:
    """The traffic app and the admin app. Pass a fresh `registry` per proxy in tests."""
    registry = registry if registry is not None else CollectorRegistry()
    metrics = build_metrics(registry)
    pool = AnalysisPool(
        analysis_spec(config),
        metrics,
        mode=config.analysis_mode,
        workers=config.analysis_workers,
        queue_max=config.analysis_queue,
        memo_entries=config.analysis_memo,
    )
    probe = None
    if config.server_probe == "auto":
        probe = ServerProbe(config.upstream, config.server_probe_interval_seconds, metrics)
        pool.on_loaded(probe.due.set)
    policy = Policy(
        models=frozenset(config.model_tokenizers),
        has_default_tokenizer=config.default_tokenizer is not None,
        max_body_bytes=config.max_body_bytes,
        inject_stream_usage=config.inject_stream_usage,
        body_timeout=config.body_timeout_seconds,
        sample_rate=config.analysis_sample_rate,
    )
    budget = BodyBudget(config.max_inflight_body_bytes, config.max_body_bytes, metrics)
    context = ProxyContext(config.upstream, metrics, pool, policy, ProblemLog(log), budget)

    async def analysis_pool(app: web.Application) -> AsyncIterator[None]:
        # Loading tokenizers takes seconds; traffic flows meanwhile and /readyz says when analysis is ready.
        loop = asyncio.get_running_loop()
        loading = loop.create_task(_start_pool(pool))
        probing = loop.create_task(probe.run(pool)) if probe is not None else None
        yield
        for task in (loading, probing):
            if task is not None:
                task.cancel()
        await pool.close()

    traffic = web.Application(client_max_size=config.max_body_bytes)
    traffic[CONTEXT] = context
    limits = HeadLimits(config.upstream_max_field_bytes, config.upstream_max_header_fields)
    traffic.cleanup_ctx.append(upstream_session(config.upstream_timeout_seconds, limits))
    traffic.cleanup_ctx.append(analysis_pool)
    if config.upstream_metrics_url:
        interval = config.upstream_metrics_interval_seconds
        scraper = EngineScraper(config.upstream_metrics_url, interval, metrics, context.problems)
        traffic.cleanup_ctx.append(scraper.ctx)
    # Every path is relayed; `[\s\S]` because `.` would not match a decoded newline (`/a%0ab` answered 404).
    traffic.router.add_route("*", r"/{tail:[\s\S]*}", handle)

    health = config.upstream + config.upstream_health_path if config.upstream_health_path else None
    token = config.admin_token.get_secret_value() if config.admin_token is not None else None
    return traffic, build_admin(pool, metrics, health, probe, config.admin_max_requests, token or None)


def upstream_session(
    timeout_seconds: float, limits: HeadLimits
) -> Callable[[web.Application], AsyncIterator[None]]:
    """The shared upstream ClientSession, owned by the traffic app's cleanup_ctx."""
    timeout = aiohttp.ClientTimeout(
        total=None,
        sock_connect=min(10.0, timeout_seconds),
        sock_read=timeout_seconds,  # per read: long streams are fine, a stalled one is not
    )

    def session(connector: aiohttp.TCPConnector) -> aiohttp.ClientSession:
        return aiohttp.ClientSession(
            connector=connector,
            timeout=timeout,
            auto_decompress=False,  # relay compressed bytes as they are
            cookie_jar=aiohttp.DummyCookieJar(),  # never carry one client's cookies to another's request
            trust_env=False,  # the upstream is the configured URL, not whatever HTTP_PROXY says
            max_line_size=limits.max_field_bytes,  # the status line
            max_field_size=limits.max_field_bytes,
            max_headers=limits.max_fields,
        )

    async def ctx(app: web.Application) -> AsyncIterator[None]:
        app[SESSION] = session(
            PoolMarkingConnector(limit=0, ttl_dns_cache=300, keepalive_timeout=KEEPALIVE_SECONDS)
        )
        app[FRESH_SESSION] = session(aiohttp.TCPConnector(limit=0, force_close=True))
        yield
        await app[SESSION].close()
        await app[FRESH_SESSION].close()

    return ctx


async def _start_pool(pool: AnalysisPool) -> None:
    try:
        await pool.start()
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # the proxy keeps relaying without analysis; /readyz stays 503
        log.error("analysis pool failed to start: %s: %s", type(exc).__name__, exc)


class ProxyURLs(NamedTuple):
    url: str  # traffic, e.g. http://127.0.0.1:40123
    admin_url: str
    admin_app: web.Application


class Servers(NamedTuple):
    traffic: web.AppRunner
    listener: asyncio.Server  # the traffic socket, accepting through guard.Guard
    admin: web.AppRunner
    admin_app: web.Application
    port: int
    admin_port: int

    async def stop(self) -> None:
        self.listener.close()
        await self.traffic.cleanup()  # closes the open connections (aiohttp's graceful shutdown)
        await self.admin.cleanup()


async def start_servers(config: ProxyConfig, registry: CollectorRegistry | None = None) -> Servers:
    traffic, admin = build_apps(config, registry)
    context = traffic[CONTEXT]
    keep_received_bytes()  # heads keep the bytes they were received with (headers.py): set here, not on import
    for dep in compat.check(log):  # the private internals used: a tested release, or one log line saying not
        context.metrics.dependency_info.labels(dep.library, dep.version, str(dep.tested).lower()).set(1)
    server_log = ServerLog(context.metrics, context.problems)  # aiohttp's own lines, without content
    # handler_cancellation: a client that disconnects cancels its handler at once, which cancels the
    # upstream request (and the generation behind it) instead of waiting for the next chunk to fail.
    # keepalive_timeout: aiohttp closes a connection idle that long (also one that opens and sends nothing).
    # auto_decompress=False: a `Content-Encoding: gzip` request body goes upstream as the client sent it
    # (aiohttp's server would otherwise inflate it and the upstream would get plain bytes labelled gzip).
    traffic_runner = web.AppRunner(
        traffic, handler_cancellation=True, access_log=None, logger=server_log,
        keepalive_timeout=config.idle_timeout_seconds, auto_decompress=False,
    )  # fmt: skip
    admin_runner = web.AppRunner(admin, access_log=None, logger=server_log)
    listener: asyncio.Server | None = None
    try:
        await traffic_runner.setup()
        limits = Limits(config.header_timeout_seconds, config.body_timeout_seconds, config.max_connections)
        assert traffic_runner.server is not None  # set by setup()
        guard = Guard(traffic_runner.server, limits, context.metrics, context.problems)
        host, port = config.listen_address
        loop = asyncio.get_running_loop()
        listener = await loop.create_server(guard, host, port, reuse_address=True, backlog=128)
        await admin_runner.setup()
        site = web.TCPSite(admin_runner, *config.admin_address, reuse_address=True)
        await site.start()
    except BaseException:
        if listener is not None:
            listener.close()
        await traffic_runner.cleanup()
        await admin_runner.cleanup()
        raise
    port = int(listener.sockets[0].getsockname()[1])
    return Servers(traffic_runner, listener, admin_runner, admin, port, int(admin_runner.addresses[-1][1]))


@asynccontextmanager
async def run_proxy(
    config: ProxyConfig,
    registry: CollectorRegistry | None = None,
    wait_ready: bool = True,
    timeout: float = 120.0,
) -> AsyncIterator[ProxyURLs]:
    """Run the proxy in this event loop: `async with run_proxy(cfg) as (url, admin_url, _): ...`.

    Use port 0 in `listen`/`admin` to get free ports. With `wait_ready`, returns once the tokenizers are
    loaded (so every request in the block is analysed).
    """
    servers = await start_servers(config, registry)
    admin, port, admin_port = servers.admin_app, servers.port, servers.admin_port
    host = config.listen_address[0]
    host = "127.0.0.1" if host in ("0.0.0.0", "") else host
    admin_host = config.admin_address[0]
    admin_host = "127.0.0.1" if admin_host in ("0.0.0.0", "") else admin_host
    try:
        if wait_ready:
            pool = admin[POOL]
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout
            while not pool.ready and not pool.reports and loop.time() < deadline:
                await asyncio.sleep(0.02)
            if not pool.ready:
                raise RuntimeError(f"proxy analysis not ready: {pool.reports}")
        yield ProxyURLs(f"http://{host}:{port}", f"http://{admin_host}:{admin_port}", admin)
    finally:
        await servers.stop()


async def serve(config: ProxyConfig) -> None:
    ensure_fd_limit(config.max_connections)
    servers = await start_servers(config)
    freeze_startup_heap()  # this process only serves from here on (heap.py)
    admin = servers.admin_app
    log.info(
        "relaying %s:%d -> %s; admin on %s:%d", config.listen_address[0], servers.port, config.upstream,
        config.admin_address[0], servers.admin_port,
    )  # fmt: skip
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    reloads: set[asyncio.Task[Any]] = set()

    def on_hup() -> None:
        task = loop.create_task(reload_tokenizers(admin))
        reloads.add(task)
        task.add_done_callback(reloads.discard)

    for sig, callback in ((signal.SIGHUP, on_hup), (signal.SIGTERM, stop.set), (signal.SIGINT, stop.set)):
        with contextlib.suppress(NotImplementedError, AttributeError):  # no POSIX signals (Windows)
            loop.add_signal_handler(sig, callback)
    try:
        await stop.wait()
        log.info("stopping")
    finally:
        for task in reloads:
            task.cancel()
        await servers.stop()
