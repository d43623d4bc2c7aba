"""Scrapes cannot stall traffic: /metrics is rendered off the event loop, a storm of concurrent scrapes
shares a few renders instead of one each, the admin requests in flight are capped (a 503 with Retry-After
beyond, counted), and with a token set /metrics and POST /reload need it while the probes stay open. A
collector in the proxy's registry notes the thread each render runs in and how many there are; the chat
latency a storm costs is measured in bench/ (bench/scrape_storm.py), not asserted here."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily

from proxy.server.app import ProxyURLs, run_proxy
from tests.eventually import eventually_async
from tests.reliability.reliability_peers import recording_origin
from tests.server.helpers import parse_metrics, proxy_config, value

GUARD_SECONDS = 60.0  # bounds a hung scrape; not a timing assertion
STORM = 200


class Probe:
    """A collector that records where and how often the registry is rendered, and can hold a render."""

    def __init__(self) -> None:
        self.threads: list[int] = []
        self.hold = threading.Event()
        self.hold.set()
        self.entered = threading.Event()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        self.threads.append(threading.get_ident())
        self.entered.set()
        self.hold.wait(GUARD_SECONDS)
        yield GaugeMetricFamily("test_probe", "renders seen", value=len(self.threads))


@asynccontextmanager
async def proxy(**settings: Any) -> AsyncIterator[tuple[ProxyURLs, Probe]]:
    registry = CollectorRegistry()
    probe = Probe()
    registry.register(probe)  # type: ignore[arg-type]
    async with recording_origin() as origin:
        config = proxy_config(origin.url, tokenizer="none", server_probe="off", **settings)
        async with run_proxy(config, registry) as urls:
            yield urls, probe


async def scrape(s: aiohttp.ClientSession, url: str, **kw: Any) -> tuple[int, dict[str, str], str]:
    async with asyncio.timeout(GUARD_SECONDS), s.get(url, **kw) as resp:
        return resp.status, dict(resp.headers), await resp.text()


async def test_a_storm_of_scrapes_shares_renders_made_off_the_event_loop() -> None:
    async with proxy(admin_max_requests=STORM) as (urls, probe), aiohttp.ClientSession() as s:
        before = len(probe.threads)
        got = await asyncio.gather(*(scrape(s, urls.admin_url + "/metrics") for _ in range(STORM)))
        assert {status for status, _, _ in got} == {200}
        assert all(
            "islwatch_requests_total" in text or "islwatch_bad_requests_total" in text for *_, text in got
        )
        renders = len(probe.threads) - before
        assert 1 <= renders <= STORM // 20, renders  # one render per scrape before
        assert threading.get_ident() not in probe.threads  # never on the loop (this test's thread)


async def test_a_scrape_sees_what_happened_before_it() -> None:
    """Shared renders never hand a scrape one that began before it arrived."""
    async with proxy() as (urls, _), aiohttp.ClientSession() as s:
        for i in range(1, 4):
            async with s.get(urls.url + f"/x{i}") as resp:
                await resp.read()
            _, _, text = await scrape(s, urls.admin_url + "/metrics")
            total = sum(
                v for (name, _), v in parse_metrics(text).items() if name == "islwatch_requests_total"
            )
            assert total == i


async def test_admin_requests_past_the_cap_wait_then_get_503_with_retry_after() -> None:
    """Two in flight (a render held), eight waiting their turn (WAITING_PER_SLOT per slot): the next is a
    503 with Retry-After; once the render goes on, every one that waited is answered."""
    async with proxy(admin_max_requests=2) as (urls, probe), aiohttp.ClientSession() as s:
        probe.hold.clear()
        probe.entered.clear()
        held = [asyncio.create_task(scrape(s, urls.admin_url + "/metrics")) for _ in range(2)]
        await asyncio.get_running_loop().run_in_executor(None, probe.entered.wait, GUARD_SECONDS)
        waiting = [asyncio.create_task(scrape(s, urls.admin_url + "/healthz")) for _ in range(8)]
        gate = urls.admin_app.middlewares[0].__self__  # type: ignore[attr-defined]
        await eventually_async(lambda: gate.waiting, until=lambda n: n == 8, what="eight waiting")
        status, headers, _ = await scrape(s, urls.admin_url + "/readyz")
        assert status == 503 and headers["Retry-After"] == "1"
        probe.hold.set()
        assert [status for status, _, _ in await asyncio.gather(*held, *waiting)] == [200] * 10
        _, _, text = await scrape(s, urls.admin_url + "/metrics")
        assert value(parse_metrics(text), "islwatch_admin_requests_refused_total", reason="busy") >= 1


async def test_the_admin_token_guards_metrics_and_reload_not_the_probes() -> None:
    token = "s3cret-token"
    async with proxy(admin_token=token) as (urls, _), aiohttp.ClientSession() as s:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic " + token}):
            status, answer, _ = await scrape(s, urls.admin_url + "/metrics", headers=headers)
            assert status == 401 and answer["WWW-Authenticate"].startswith("Bearer")
        async with s.post(urls.admin_url + "/reload") as resp:
            assert resp.status == 401
        for path in ("/healthz", "/readyz"):
            assert (await scrape(s, urls.admin_url + path))[0] == 200
        status, _, text = await scrape(
            s, urls.admin_url + "/metrics", headers={"Authorization": f"bearer {token}"}
        )
        assert status == 200
        assert value(parse_metrics(text), "islwatch_admin_requests_refused_total", reason="unauthorized") == 4
