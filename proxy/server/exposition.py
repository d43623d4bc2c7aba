"""/metrics without stalling traffic: the admin port shares the data path's event loop, and rendering the
registry costs tens of milliseconds of Python (~27 ms with a few models' histograms), so 200 scrapers
rendering it on the loop moved chat p50 from 18 ms to 3.4 s (issue 28).

- Rendered in a thread of its own (`prometheus_client`'s encoders, as its aiohttp adapter picks them by
  `Accept`; gzip when asked, zlib releases the GIL). The loop only awaits.
- Scrapes share renders: every scrape waiting when a render starts gets its output, so a storm of scrapes
  costs one render at a time, never one each. A scrape never gets a render that began before it arrived:
  the numbers are as fresh as a render made for it alone.
- Renders are spaced so that they take at most `DUTY` of the time (a render of d seconds is followed by at
  least d * (1 / DUTY - 1) without one): the thread's share of the GIL stays small whatever the scrape rate.
- `AdminGate` caps the admin requests in flight (beyond: they wait, and past a queue, 503 with Retry-After) and, with a token set,
  answers 401 to /metrics and POST /reload without `Authorization: Bearer <token>` (RFC 6750). /healthz and
  /readyz stay open: the kubelet's httpGet probes cannot read a Secret, and they say nothing of traffic.
"""

from __future__ import annotations

import asyncio
import gzip
import hmac
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from aiohttp import hdrs, web
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder, gzip_accepted

from proxy.server.metrics import Metrics

DUTY = 0.05  # the largest share of time spent rendering under a scrape storm (GIL held in 5 ms slices)
RETRY_AFTER_SECONDS = 1
WAITING_PER_SLOT = 4
OPEN_PATHS = frozenset(("/healthz", "/readyz"))


@dataclass(frozen=True)
class Rendered:
    content_type: str
    body: bytes
    gzipped: bool


@dataclass
class _Slot:
    """The renders of one output format: `pending` is the render the next scrapes get (not started yet)."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    pending: asyncio.Future[Rendered] | None = None
    not_before: float = 0.0  # loop time before which the next render does not start


class Exposition:
    """/metrics's handler: renders off the loop, shared by the scrapes waiting, spaced to `DUTY`."""

    def __init__(self, registry: CollectorRegistry, duty: float = DUTY) -> None:
        self.registry = registry
        self.duty = duty
        self.renders = 0
        self._slots: dict[tuple[str, bool], _Slot] = {}
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="islwatch-metrics")

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def handle(self, request: web.Request) -> web.Response:
        accept = ",".join(request.headers.getall(hdrs.ACCEPT, []))
        zipped = gzip_accepted(request.headers.get(hdrs.ACCEPT_ENCODING, ""))
        names = request.query.getall("name[]", [])
        if names:  # a filter the scraper chose: rendered for this scrape alone, still off the loop
            out = await asyncio.get_running_loop().run_in_executor(
                self._executor, self._render, accept, zipped, tuple(names)
            )
        else:
            out = await self._shared(accept, zipped)
        headers = {hdrs.CONTENT_TYPE: out.content_type}
        if out.gzipped:
            headers[hdrs.CONTENT_ENCODING] = "gzip"
        return web.Response(body=out.body, headers=headers)

    async def _shared(self, accept: str, zipped: bool) -> Rendered:
        key = (choose_encoder(accept)[1], zipped)  # a handful of content types: bounded
        slot = self._slots.get(key)
        if slot is None:
            slot = self._slots[key] = _Slot()
        if slot.pending is None:
            slot.pending = asyncio.get_running_loop().create_future()
            task = asyncio.get_running_loop().create_task(self._next_render(slot, accept, zipped))
            task.add_done_callback(_retrieve)
        return await asyncio.shield(slot.pending)

    async def _next_render(self, slot: _Slot, accept: str, zipped: bool) -> None:
        loop = asyncio.get_running_loop()
        async with slot.lock:  # after the render in progress, if any
            wait = slot.not_before - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            future, slot.pending = slot.pending, None  # scrapes from now on wait for the next one
            assert future is not None
            started = loop.time()
            try:
                out = await loop.run_in_executor(self._executor, self._render, accept, zipped, ())
            except BaseException as exc:
                if not future.done():
                    future.set_exception(exc)
                raise
            finally:
                took = loop.time() - started
                slot.not_before = loop.time() + took * (1 / self.duty - 1)
            if not future.done():
                future.set_result(out)

    def _render(self, accept: str, zipped: bool, names: tuple[str, ...]) -> Rendered:
        """In the exposition thread: prometheus_client's exposition core (exposition._bake_output)."""
        self.renders += 1
        encoder, content_type = choose_encoder(accept)
        registry = self.registry.restricted_registry(names) if names else self.registry
        body = encoder(registry)
        return Rendered(content_type, gzip.compress(body) if zipped else body, zipped)


def _retrieve(task: asyncio.Task[None]) -> None:
    if not task.cancelled():
        task.exception()  # told to the scrapes through their future; not "never retrieved" at exit


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class AdminGate:
    """The admin app's middleware: at most `max_requests` in flight, and the bearer token when set. Requests
    past the cap wait their turn, up to `WAITING_PER_SLOT` per slot: a scraper that waits sends nothing more,
    where one answered at once would come straight back (a storm of instant 503s costs the loop too). Past
    that, a 503 with Retry-After."""

    def __init__(self, max_requests: int, token: str | None, metrics: Metrics) -> None:
        self.max_requests = max_requests
        self.waiting = 0
        self._slots = asyncio.Semaphore(max_requests)
        self._expected = token.encode() if token else None
        self._metrics = metrics

    @web.middleware  # on a method: aiohttp reads the marker from the bound method, not from an instance
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if self._expected is not None and request.path not in OPEN_PATHS and not self._authorized(request):
            self._metrics.admin_refused("unauthorized")
            return web.Response(status=401, headers={hdrs.WWW_AUTHENTICATE: 'Bearer realm="islwatch"'})
        if self._slots.locked() and self.waiting >= WAITING_PER_SLOT * self.max_requests:
            self._metrics.admin_refused("busy")
            return web.Response(status=503, headers={hdrs.RETRY_AFTER: str(RETRY_AFTER_SECONDS)})
        self.waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self.waiting -= 1
        try:
            return await handler(request)
        finally:
            self._slots.release()

    def _authorized(self, request: web.Request) -> bool:
        assert self._expected is not None
        scheme, _, token = request.headers.get(hdrs.AUTHORIZATION, "").strip().partition(" ")
        given = token.strip().encode("utf-8", "surrogateescape")
        # The scheme is case-insensitive (RFC 9110 11.1); compare_digest takes as long wherever they differ.
        return scheme.lower() == "bearer" and hmac.compare_digest(given, self._expected)
