"""The engine's own token counters, beside the usage that went through the sidecar (`--upstream-metrics-url`).

The engine's Prometheus endpoint is scraped every `upstream_metrics_interval_seconds`; what its token counters
added since the first successful scrape is exported as `islwatch_engine_tokens_total{kind, engine}`, so it
compares with islwatch's sums of usage over the same time (`islwatch_isl_tokens_sum{kind="server"}`,
`islwatch_output_tokens_sum`, `islwatch_cached_prompt_tokens_sum`). Each kind means one thing on every engine;
the counters behind it, and what they count, were measured on the real servers (docs/metrics.md, "The engine's
own counters"), never assumed:

- vLLM 0.32 (`vllm/v1/metrics/loggers.py`): `vllm:prompt_tokens_total` counts every prompt token, cached ones
  included; `vllm:prompt_tokens_cached_total` and `vllm:prefix_cache_hits_total` the cached part;
  `vllm:prefix_cache_queries_total` the tokens looked up.
- llama-server with `--metrics`: `llamacpp:prompt_tokens_total` is "excluding cached tokens", so `prompt` adds
  `llamacpp:prompt_tokens_cached_total` back.
- SGLang with `--enable-metrics` (docs "Production Metrics"; `sglang/srt/observability/metrics_collector.py`):
  `sglang:prompt_tokens_total` is each finished request's whole prompt; `sglang:cached_tokens_total` the
  cached part (by `cache_source`). Read from its source, not measured here.

Counter resets (a restarted engine) are handled as Prometheus' `increase()` handles them: a series below its
last value counts from zero. A series that first appears after the first scrape (SGLang creates them on the
first request) counts from zero too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass

import aiohttp
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from proxy.server.metrics import Metrics
from proxy.server.problems import ProblemLog

log = logging.getLogger("islwatch.engine")

TIMEOUT_SECONDS = 10.0
MAX_BYTES = 32 << 20  # a /metrics page larger than this is not one we can use


@dataclass(frozen=True)
class Engine:
    name: str  # the `engine` label
    kinds: Mapping[str, tuple[str, ...]]  # kind -> the sample names whose increases add up to it


ENGINES = (
    Engine("vllm", {
        "prompt": ("vllm:prompt_tokens_total",),
        "cached_prompt": ("vllm:prompt_tokens_cached_total",),
        "generation": ("vllm:generation_tokens_total",),
        "prefix_cache_queries": ("vllm:prefix_cache_queries_total",),
        "prefix_cache_hits": ("vllm:prefix_cache_hits_total",),
    }),
    Engine("llama.cpp", {
        "prompt": ("llamacpp:prompt_tokens_total", "llamacpp:prompt_tokens_cached_total"),
        "cached_prompt": ("llamacpp:prompt_tokens_cached_total",),
        "generation": ("llamacpp:tokens_predicted_total",),
    }),
    Engine("sglang", {
        "prompt": ("sglang:prompt_tokens_total",),
        "cached_prompt": ("sglang:cached_tokens_total",),
        "generation": ("sglang:generation_tokens_total",),
    }),
)  # fmt: skip
WANTED = frozenset(name for e in ENGINES for names in e.kinds.values() for name in names)
PREFIXES = tuple(sorted({name.split(":", 1)[0] + ":" for name in WANTED}))

Series = tuple[str, tuple[tuple[str, str], ...]]  # (sample name, sorted labels)


def samples(text: str) -> dict[Series, float]:
    """The wanted counters' samples of a Prometheus text page. Lines are filtered before parsing, so a large
    page (vLLM's histograms) costs a scan, and a line of a family islwatch does not read is never parsed."""
    lines = [
        line
        for line in text.splitlines()
        if line.startswith(PREFIXES) and line.split("{", 1)[0].split(" ", 1)[0] in WANTED
    ]
    out: dict[Series, float] = {}
    for family in text_string_to_metric_families("\n".join(lines) + "\n"):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = float(s.value)
    return out


def engine_of(found: Mapping[Series, float]) -> Engine | None:
    """The engine whose `prompt` counters the page has (one server exposes one engine's names)."""
    names = {name for name, _ in found}
    for engine in ENGINES:
        if set(engine.kinds["prompt"]) <= names:
            return engine
    return None


class Increases:
    """Each series' increase since the first scrape; `update` returns the increase since the last one."""

    def __init__(self) -> None:
        self._last: dict[Series, float] | None = None

    def update(self, now: Mapping[Series, float]) -> dict[Series, float]:
        first = self._last is None
        last = self._last or {}
        out = {}
        for key, value in now.items():
            before = last.get(key)
            if before is None:
                out[key] = 0.0 if first else value  # the baseline, or a series that started after it
            else:
                out[key] = value - before if value >= before else value  # below: the engine restarted
        self._last = {**last, **now}
        return out


def by_kind(engine: Engine, increases: Mapping[Series, float]) -> dict[str, float]:
    return {
        kind: sum(v for (name, _), v in increases.items() if name in names)
        for kind, names in engine.kinds.items()
    }


class EngineScraper:
    """Scrapes the engine's /metrics at start and every `interval` seconds; owned by the traffic app."""

    def __init__(self, url: str, interval: float, metrics: Metrics, problems: ProblemLog) -> None:
        self.url = url
        self.interval = interval
        self.metrics = metrics
        self.problems = problems
        self.engine: Engine | None = None
        self._increases = Increases()

    async def ctx(self, app: web.Application) -> AsyncIterator[None]:
        """A `cleanup_ctx` generator: the scrape loop runs while the app does."""
        task = asyncio.get_running_loop().create_task(self.run())
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task  # its session closes before the app's cleanup ends

    async def run(self) -> None:
        self.metrics.engine_scraped(None)
        timeout = aiohttp.ClientTimeout(total=TIMEOUT_SECONDS)
        async with aiohttp.ClientSession(timeout=timeout, trust_env=False) as session:
            while True:
                self.metrics.engine_scraped(await self.once(session))
                await asyncio.sleep(self.interval)

    async def once(self, session: aiohttp.ClientSession) -> str:
        """One scrape: `ok`, `error` (transport, status, a page that does not parse) or `no_counters`."""
        try:
            async with session.get(self.url) as resp:
                if resp.status != 200:
                    raise ValueError(f"HTTP {resp.status}")
                raw = bytearray()
                async for chunk in resp.content.iter_chunked(1 << 16):
                    raw += chunk
                    if len(raw) > MAX_BYTES:
                        raise ValueError("page too large")
            found = samples(raw.decode("utf-8"))
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
            # UnicodeDecodeError and the text parser's errors are ValueErrors.
            self.problems("engine_scrape_error", "engine metrics %s: %s", self.url, type(exc).__name__)
            return "error"
        engine = engine_of(found)
        if engine is None:
            self.problems(
                "engine_no_counters",
                "engine metrics %s: no vLLM, llama.cpp (--metrics) or SGLang (--enable-metrics) token counters",
                self.url,
            )
            return "no_counters"
        if engine is not self.engine:  # the first scrape with counters (or another server behind the URL)
            self.engine, self._increases = engine, Increases()
            log.info("engine metrics %s: %s token counters, every %gs", self.url, engine.name, self.interval)
        for kind, value in by_kind(engine, self._increases.update(found)).items():
            self.metrics.engine_counted(kind, engine.name, value)
        return "ok"
