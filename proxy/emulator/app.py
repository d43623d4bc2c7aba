"""`islwatch emulate`: an OpenAI-compatible upstream that counts prompts the way vLLM does, with fault switches.

It answers `/v1/chat/completions`, `/v1/completions`, `/v1/embeddings`, `/v1/responses` (JSON and SSE),
`/v1/models`, `/health` and vLLM's `/tokenize` (`tokenize.py`). The answer text is deterministic: exactly `max_tokens` tokens of the emulator's
tokenizer. `usage.prompt_tokens` comes from `counting`, a second implementation of vLLM's path, so the
proxy's counting core is checked against it. Faults (`faults.py`) make the count drift the way real
deployments do, or make requests fail. This module is the HTTP side: handlers, the app, serving.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Iterator
from typing import Any

import orjson
from aiohttp import web

from proxy.core.endpoints import BY_PATH, Endpoint
from proxy.core.tokenizer import LoadedTokenizer, load_tokenizer
from proxy.emulator.answers import error_body, full_body, models_body
from proxy.emulator.config import EmulatorConfig
from proxy.emulator.errors import RequestError
from proxy.emulator.plan import Emulator, Plan
from proxy.emulator.streams import stream_events
from proxy.emulator.tokenize import tokenize_answer

__all__ = ["EMULATOR", "EmulatorConfig", "build_emulator_app", "serve", "start_emulator", "url_host"]

log = logging.getLogger("islwatch.emulate")

RESET_AFTER_CHUNKS = 3  # `reset-mid-stream`: chunks written before the transport is aborted
MAX_BODY_BYTES = 64 * 1024 * 1024  # above the proxy's default limit, so "huge body" tests reach us
EMULATOR = web.AppKey("emulator", Emulator)
MODELS_BODY = web.AppKey("models_body", bytes)  # GET /v1/models, built once with the app


def error_response(message: str, status: int, param: str | None = None) -> web.Response:
    return web.Response(
        body=error_body(message, status, param), status=status, content_type="application/json"
    )


async def _write_stream(request: web.Request, emu: Emulator, plan: Plan) -> web.StreamResponse:
    resp = web.StreamResponse(
        headers={"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
    )
    events: Iterator[bytes] | list[bytes] = stream_events(emu, plan)
    cut_at = -1
    if emu.draw_reset():
        events = list(events)
        cut_at = min(RESET_AFTER_CHUNKS, len(events) - 1)  # always before the stream's natural end
    gap = emu.config.faults.token_latency_seconds
    emu.stats.streams_started += 1
    try:
        await resp.prepare(request)
        for i, chunk in enumerate(events):
            if i == cut_at:
                # Close the connection with the chunked body unfinished: the client sees a truncated
                # stream (aiohttp: ClientPayloadError; httpx: RemoteProtocolError), as when a server dies.
                emu.stats.streams_reset += 1
                if request.transport is not None:
                    request.transport.abort()
                return resp
            if gap and i:
                await asyncio.sleep(gap)
            await resp.write(chunk)  # aiohttp hands each write to the transport at once: chunks stay chunks
        await resp.write_eof()
    except ConnectionResetError:  # the client went away; aiohttp does not cancel the handler by default
        emu.stats.client_disconnects += 1
        return resp
    except asyncio.CancelledError:
        emu.stats.client_disconnects += 1
        raise
    emu.stats.streams_completed += 1
    return resp


def _inference_handler(endpoint: Endpoint) -> Any:
    async def handle(request: web.Request) -> web.StreamResponse:
        emu = request.app[EMULATOR]
        emu.stats.requests += 1
        status = emu.draw_status()  # drawn on arrival, so the sequence depends on request order only
        if emu.config.faults.latency_seconds:
            await asyncio.sleep(emu.config.faults.latency_seconds)
        if status is not None:
            emu.stats.status_faults += 1
            return error_response(f"emulated fault: status {status}", status)
        try:
            plan = emu.plan(endpoint, await request.read())
        except RequestError as exc:
            return error_response(str(exc), exc.status, exc.param)
        if plan.stream:
            return await _write_stream(request, emu, plan)
        return web.Response(body=orjson.dumps(full_body(emu, plan)), content_type="application/json")

    return handle


async def _tokenize(request: web.Request) -> web.Response:
    """vLLM's `/tokenize`: never subject to the status or latency faults (they model inference)."""
    try:
        answer = tokenize_answer(request.app[EMULATOR], await request.read())
    except RequestError as exc:
        return error_response(str(exc), exc.status, exc.param)
    return web.Response(body=orjson.dumps(answer), content_type="application/json")


async def _models(request: web.Request) -> web.Response:
    return web.Response(body=request.app[MODELS_BODY], content_type="application/json")


async def _health(request: web.Request) -> web.Response:
    return web.Response(status=200)  # vLLM: 200 with an empty body


async def _stats(request: web.Request) -> web.Response:
    emu = request.app[EMULATOR]
    body = {**emu.stats.as_dict(), "faults": emu.config.faults.describe()}
    return web.Response(body=orjson.dumps(body), content_type="application/json")


def build_emulator_app(
    config: EmulatorConfig, tokenizer: LoadedTokenizer | Any | None = None
) -> web.Application:
    """The emulator as an aiohttp app. `tokenizer` (a LoadedTokenizer or a transformers tokenizer) skips
    loading `config.tokenizer`, so tests share one loaded tokenizer between apps with different faults. The
    `tokenizer=SPEC` fault's tokenizer is loaded here, once per app."""
    if tokenizer is None:
        tokenizer = load_tokenizer(config.tokenizer, chat_template_file=config.chat_template)
    swapped = config.faults.tokenizer
    encoder = load_tokenizer(swapped) if swapped is not None else None
    app = web.Application(client_max_size=MAX_BODY_BYTES)
    emu = Emulator(config, tokenizer, encoder)
    app[EMULATOR] = emu
    app[MODELS_BODY] = models_body(config.served_models, emu.created())
    for path, endpoint in BY_PATH.items():
        app.router.add_post(path, _inference_handler(endpoint))
    app.router.add_post("/tokenize", _tokenize)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/health", _health)
    app.router.add_get("/emulator/stats", _stats)
    return app


def url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


async def start_emulator(
    config: EmulatorConfig, host: str = "127.0.0.1", port: int = 0, tokenizer: LoadedTokenizer | Any = None
) -> tuple[web.AppRunner, str]:
    """Serve in the running loop; returns the runner (call `await runner.cleanup()`) and the base URL."""
    runner = web.AppRunner(build_emulator_app(config, tokenizer), access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = runner.addresses[0]
    return runner, f"http://{url_host(host)}:{bound[1]}"


async def serve(app: web.Application, host: str, port: int) -> None:
    """Serve `app` until SIGINT or SIGTERM; prints one ready line with the bound URL for scripts."""
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    emu = app[EMULATOR]
    url = f"http://{url_host(host)}:{runner.addresses[0][1]}"
    faults = ",".join(emu.config.faults.describe()) or "none"
    log.info("emulating %s on %s (faults: %s)", ",".join(emu.config.served_models), url, faults)
    print(f"islwatch emulate: listening on {url}", flush=True)  # a ready line for scripts and the demo
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()
