"""The engine-counter scraper (proxy/server/engine_metrics.py) against a real HTTP server serving /metrics
pages in the engines' own formats (vLLM 0.32's and llama-server's pages as captured, with the values the test
sets; SGLang's from its documentation), then the same through a real proxy's /metrics. The real servers'
counters are checked against their usage in tests/vllm_server/test_vllm_bill.py and
tests/interop/test_llama_server_bill.py."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Iterator
from dataclasses import dataclass

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from proxy.server.app import run_proxy
from proxy.server.engine_metrics import EngineScraper, Increases, engine_of, samples
from proxy.server.metrics import build_metrics
from proxy.server.problems import ProblemLog
from tests.server.helpers import Background, fetch_metrics, proxy_config, serve_app, value, wait_metrics

MODEL = 'engine="0",model_name="/models/qwen"'


def vllm_page(prompt: float, cached: float, generation: float) -> str:
    """vLLM 0.32's /metrics, cut to the token counters and neighbours whose names share their prefixes."""
    return f"""# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{{{MODEL}}} {prompt}
vllm:prefix_cache_queries_created{{{MODEL}}} 1.7961269103098156e+09
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{{{MODEL}}} {cached}
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{{{MODEL}}} {prompt}
vllm:prompt_tokens_created{{{MODEL}}} 1.796126910309944e+09
# HELP vllm:prompt_tokens_by_source_total Number of prompt tokens by source.
# TYPE vllm:prompt_tokens_by_source_total counter
vllm:prompt_tokens_by_source_total{{{MODEL},source="local_compute"}} {prompt - cached}
vllm:prompt_tokens_by_source_total{{{MODEL},source="local_cache_hit"}} {cached}
# HELP vllm:prompt_tokens_cached_total Number of cached prompt tokens (local + external).
# TYPE vllm:prompt_tokens_cached_total counter
vllm:prompt_tokens_cached_total{{{MODEL}}} {cached}
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{{{MODEL}}} {generation}
# HELP vllm:request_prompt_tokens Number of prefill tokens processed.
# TYPE vllm:request_prompt_tokens histogram
vllm:request_prompt_tokens_sum{{{MODEL}}} {prompt}
vllm:request_prompt_tokens_bucket{{{MODEL},le="1.0"}} 0.0
vllm:request_prompt_tokens_bucket{{{MODEL},le="+Inf"}} 2.0
vllm:request_prompt_tokens_count{{{MODEL}}} 2.0
"""


def llama_page(processed: int, cached: int, predicted: int) -> str:
    """llama-server's --metrics page (its first lines, as llama.cpp 0.5.0-dev writes them)."""
    return f"""# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed, excluding cached tokens
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total {processed}
# HELP llamacpp:prompt_tokens_cached_total Number of prompt tokens reused from the cache
# TYPE llamacpp:prompt_tokens_cached_total counter
llamacpp:prompt_tokens_cached_total {cached}
# HELP llamacpp:prompt_seconds_total Total time spent processing prompts
# TYPE llamacpp:prompt_seconds_total counter
llamacpp:prompt_seconds_total 0.004909
# HELP llamacpp:tokens_predicted_total Number of generation tokens processed
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total {predicted}
# HELP llamacpp:prompt_tokens_seconds Average prompt throughput in tokens/s
# TYPE llamacpp:prompt_tokens_seconds gauge
llamacpp:prompt_tokens_seconds 0
"""


# SGLang's example page (docs.sglang.io, "Production Metrics"), with the cached counter its collector defines.
SGLANG_PAGE = """# HELP sglang:prompt_tokens_total Number of prefill tokens processed.
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{model_name="meta-llama/Llama-3.1-8B-Instruct"} 8.128902e+06
# HELP sglang:generation_tokens_total Number of generation tokens processed.
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{model_name="meta-llama/Llama-3.1-8B-Instruct"} 7.557572e+06
# HELP sglang:cached_tokens_total Number of cached prompt tokens by source (device/host/storage).
# TYPE sglang:cached_tokens_total counter
sglang:cached_tokens_total{cache_source="device",model_name="meta-llama/Llama-3.1-8B-Instruct"} 1000
"""


def by_name(page: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for (name, _), v in samples(page).items():
        out[name] = out.get(name, 0.0) + v
    return out


def test_only_the_token_counters_are_read() -> None:
    """`vllm:prompt_tokens_by_source_total` and the `_created` and histogram series share the counters'
    prefixes; none of them is read."""
    assert by_name(vllm_page(263, 256, 10)) == {
        "vllm:prompt_tokens_total": 263,
        "vllm:prompt_tokens_cached_total": 256,
        "vllm:generation_tokens_total": 10,
        "vllm:prefix_cache_queries_total": 263,
        "vllm:prefix_cache_hits_total": 256,
    }


@pytest.mark.parametrize(
    ("page", "engine"),
    [(vllm_page(1, 0, 1), "vllm"), (llama_page(1, 0, 1), "llama.cpp"), (SGLANG_PAGE, "sglang")],
    ids=["vllm", "llama.cpp", "sglang"],
)
def test_the_engine_is_known_by_its_counters(page: str, engine: str) -> None:
    found = engine_of(samples(page))
    assert found is not None and found.name == engine


def test_a_page_without_token_counters_is_no_engine() -> None:
    registry = CollectorRegistry()
    build_metrics(registry, process_metrics=False)
    from prometheus_client import generate_latest

    assert engine_of(samples(generate_latest(registry).decode())) is None
    assert engine_of(samples("# nothing here\n")) is None


def test_increases_count_from_the_first_scrape_and_through_resets() -> None:
    a, b = ("x_total", ()), ("y_total", (("engine", "1"),))
    inc = Increases()
    assert inc.update({a: 500.0}) == {a: 0.0}  # the baseline: what happened before islwatch is not counted
    assert inc.update({a: 520.0}) == {a: 20.0}
    assert inc.update({a: 520.0, b: 7.0}) == {a: 0.0, b: 7.0}  # a series born after the baseline
    assert inc.update({a: 3.0, b: 9.0}) == {a: 3.0, b: 2.0}  # the engine restarted: counts from zero


@dataclass
class Engine:
    url: str
    page: str = ""
    status: int = 200


@pytest.fixture(scope="module")
def background() -> Iterator[Background]:
    bg = Background()
    yield bg
    bg.close()


@pytest.fixture(scope="module")
def engine(background: Background) -> Engine:
    """A real HTTP server answering GET /metrics with whatever page the test set, written in 4 KB pieces
    (a large page reaches the scraper in many chunks, as a real engine's does)."""
    state = Engine(url="")

    async def metrics(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(status=state.status, headers={"Content-Type": "text/plain"})
        await resp.prepare(request)
        data = state.page.encode()
        for i in range(0, len(data), 4096):
            await resp.write(data[i : i + 4096])
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    base = background.enter(serve_app(app))
    state.url = f"{base}/metrics"
    return state


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape_all(url: str, engine: Engine, pages: list[tuple[int, str]]) -> tuple[list[str], dict[str, float]]:
    """Results of one scrape per (status, page), and the exported tokens by `kind/engine` after them."""
    metrics = build_metrics(CollectorRegistry(), process_metrics=False)
    scraper = EngineScraper(url, 1.0, metrics, ProblemLog(logging.getLogger("test_engine_metrics")))

    async def go() -> list[str]:
        async with aiohttp.ClientSession() as session:
            results = []
            for status, page in pages:
                engine.status, engine.page = status, page
                results.append(await scraper.once(session))
            return results

    results = asyncio.run(go())
    tokens = {
        f"{s.labels['kind']}/{s.labels['engine']}": s.value
        for family in metrics.registry.collect()
        if family.name == "islwatch_engine_tokens"
        for s in family.samples
        if s.name.endswith("_total")
    }
    return results, tokens


def test_llama_cpp_prompt_adds_the_cached_tokens_back(engine: Engine) -> None:
    """llama.cpp's prompt counter excludes cached tokens; `prompt` is comparable with usage.prompt_tokens.
    The pages are the measured ones: two 41-token chats, the second served 40 tokens from the slot's cache."""
    results, tokens = scrape_all(
        engine.url,
        engine,
        [(200, llama_page(0, 0, 0)), (200, llama_page(41, 0, 5)), (200, llama_page(42, 40, 10))],
    )
    assert results == ["ok", "ok", "ok"]
    assert tokens == {"prompt/llama.cpp": 82, "cached_prompt/llama.cpp": 40, "generation/llama.cpp": 10}


def test_vllm_kinds(engine: Engine) -> None:
    results, tokens = scrape_all(
        engine.url, engine, [(200, vllm_page(1000, 100, 50)), (200, vllm_page(1526, 356, 60))]
    )
    assert results == ["ok", "ok"]
    assert tokens == {
        "prompt/vllm": 526,
        "cached_prompt/vllm": 256,
        "generation/vllm": 10,
        "prefix_cache_queries/vllm": 526,
        "prefix_cache_hits/vllm": 256,
    }


def test_a_large_page_is_read_whole(engine: Engine) -> None:
    """vLLM's real page is tens of KB of histograms: the counters after them are still read."""
    padding = "".join(
        f'vllm:time_to_first_token_seconds_bucket{{{MODEL},le="{i}.0"}} 1.0\n' for i in range(5000)
    )
    results, tokens = scrape_all(
        engine.url, engine, [(200, padding + vllm_page(10, 0, 1)), (200, padding + vllm_page(110, 32, 9))]
    )
    assert results == ["ok", "ok"]
    assert (
        tokens["prompt/vllm"] == 100 and tokens["cached_prompt/vllm"] == 32 and tokens["generation/vllm"] == 8
    )


def test_failed_scrapes_count_nothing_and_the_next_good_one_catches_up(engine: Engine) -> None:
    results, tokens = scrape_all(
        engine.url,
        engine,
        [
            (200, llama_page(10, 0, 1)),  # the baseline
            (500, "oops"),
            (200, "llamacpp:prompt_tokens_total not-a-number\n"),
            (200, "# HELP nothing\n"),
            (200, llama_page(30, 5, 4)),
        ],
    )
    assert results == ["ok", "error", "error", "no_counters", "ok"]
    assert tokens == {"prompt/llama.cpp": 25, "cached_prompt/llama.cpp": 5, "generation/llama.cpp": 3}


def test_an_unreachable_engine_is_an_error() -> None:
    results, tokens = scrape_all(f"http://127.0.0.1:{free_port()}/metrics", Engine(url=""), [(200, "")])
    assert results == ["error"] and tokens == {}


def test_through_the_proxy(engine: Engine, background: Background) -> None:
    """`--upstream-metrics-url`: the proxy scrapes on its interval and exports the increase since its start
    beside its own series; the scrape results are counted."""
    engine.status, engine.page = 200, llama_page(1000, 100, 200)  # traffic before the proxy started
    cfg = proxy_config(
        f"http://127.0.0.1:{free_port()}",
        server_probe="off",
        upstream_metrics_url=engine.url,
        upstream_metrics_interval_seconds=0.05,
    )
    _, admin_url, _ = background.enter(run_proxy(cfg))

    async def check() -> None:
        async with aiohttp.ClientSession() as s:
            await wait_metrics(
                s, admin_url, lambda m: value(m, "islwatch_engine_scrapes_total", result="ok") > 0
            )
            engine.page = llama_page(1041, 140, 205)
            m = await wait_metrics(
                s, admin_url, lambda m: value(m, "islwatch_engine_tokens_total", kind="prompt") == 81
            )
            assert value(m, "islwatch_engine_tokens_total", kind="cached_prompt", engine="llama.cpp") == 40
            assert value(m, "islwatch_engine_tokens_total", kind="generation", engine="llama.cpp") == 5
            engine.status = 503
            errors = value(await fetch_metrics(s, admin_url), "islwatch_engine_scrapes_total", result="error")
            m = await wait_metrics(
                s, admin_url, lambda m: value(m, "islwatch_engine_scrapes_total", result="error") > errors
            )
            assert (
                value(m, "islwatch_engine_tokens_total", kind="prompt") == 81
            )  # nothing lost, nothing added
            engine.status = 200

    background.run(check())
