"""Real HTTP: the loadgen against the emulator (in-process aiohttp server) and through the islwatch proxy.

Every request's server count (usage.prompt_tokens, computed by the emulator on vLLM's path, not through
the counting core the loadgen budgets with) must equal the loadgen's target.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from typing import Any

import pytest

from loadgen.config import LoadgenConfig
from loadgen.send import proxy_metrics
from loadgen.send.runner import Engine, Record
from loadgen.workload.conversations import Workload
from proxy.emulator.app import EmulatorConfig, start_emulator
from tests.builders import build_tokenizer
from tests.conftest import load_builtin, load_shared
from tests.eventually import eventually_async


async def serve(tok: Any) -> tuple[Any, str]:
    return await start_emulator(EmulatorConfig(), tokenizer=tok)


@pytest.fixture
async def mistral_emulator() -> AsyncIterator[str]:
    runner, url = await serve(load_builtin())
    yield url
    await runner.cleanup()


async def run(tok: Any, url: str, **kw: Any) -> list[Record]:
    base = {"url": url, "isl": 128, "osl": 8, "concurrency": 2, "request_count": 6}
    cfg = LoadgenConfig(**{**base, **kw})
    return await Engine(cfg, Workload(tok, cfg)).run()


def assert_exact(records: list[Record], n: int) -> None:
    measured = [r for r in records if not r.warmup]
    assert len(measured) == n
    for r in measured:
        assert r.error is None and r.budget_error is None, r
        assert r.client_isl == r.target_isl == r.server_prompt_tokens, r


async def test_multi_turn_streaming_with_marker(mistral_emulator: str) -> None:
    recs = await run(
        load_builtin().tokenizer, mistral_emulator, isl=300, turns=3, streaming=True,
        cache_bust="first_turn_suffix", request_count=9, warmup=2,
    )  # fmt: skip
    assert_exact(recs, 9)
    assert sum(r.warmup for r in recs) == 2
    by_conv: dict[str, list[Record]] = {}
    for r in recs:
        if not r.warmup:
            by_conv.setdefault(r.conversation, []).append(r)
    for turns in by_conv.values():
        turns.sort(key=lambda r: r.turn)
        assert [r.turn for r in turns] == list(range(1, len(turns) + 1))
        for prev, cur in itertools.pairwise(turns):
            # The emulator's real reply, rendered, sits between the two user turns.
            assert cur.server_prompt_tokens == prev.server_prompt_tokens + cur.reply_tokens + 300
            assert cur.reply_tokens > 0
    streamed = [r for r in recs if not r.warmup]
    assert all(r.ttft_ms is not None and r.output_tokens == 8 for r in streamed)


async def test_open_loop_constant_rate(mistral_emulator: str) -> None:
    recs = await run(
        load_builtin().tokenizer, mistral_emulator, concurrency=None, request_rate=200.0, arrival="constant",
        request_count=10, cache_bust="first_turn_prefix",
    )  # fmt: skip
    assert_exact(recs, 10)
    assert all(r.send_lateness_ms is not None for r in recs)


async def test_completions(mistral_emulator: str) -> None:
    recs = await run(load_builtin().tokenizer, mistral_emulator, endpoint="completions", isl=77)
    assert_exact(recs, 6)


async def test_system_prompt_marker_on_system_built_chatml() -> None:
    tok = build_tokenizer("chatml")
    runner, url = await serve(tok)
    try:
        recs = await run(
            tok, url, isl=120, turns=2, shared_system_prompt_length=30, cache_bust="system_prefix",
            content_parts=True, request_count=4,
        )  # fmt: skip
    finally:
        await runner.cleanup()
    assert_exact(recs, 4)


async def test_shared_family_against_emulator(shared_family: str) -> None:
    loaded = load_shared(shared_family)
    kw: dict[str, Any] = {"isl": 1000, "turns": 3, "request_count": 6}
    try:
        cfg = LoadgenConfig(
            url="http://x", concurrency=1, shared_system_prompt_length=100, cache_bust="system_suffix", **kw
        )
        Workload(loaded.tokenizer, cfg).preflight()
        kw.update(shared_system_prompt_length=100, cache_bust="system_suffix")
    except ValueError:  # the template rejects a system message: mark the first user turn instead
        kw.update(cache_bust="first_turn_prefix")
    runner, url = await serve(loaded)
    try:
        recs = await run(loaded.tokenizer, url, **kw)
    finally:
        await runner.cleanup()
    assert_exact(recs, 6)


async def test_through_the_proxy(mistral_emulator: str) -> None:
    from proxy.server.app import run_proxy
    from proxy.server.config import ProxyConfig

    config = ProxyConfig(
        upstream=mistral_emulator, listen="127.0.0.1:0", admin="127.0.0.1:0", analysis_mode="thread"
    )
    async with run_proxy(config) as (url, admin_url, _):
        metrics = f"{admin_url}/metrics"
        before = await asyncio.to_thread(proxy_metrics.scrape, metrics)
        assert before is not None
        recs = await run(
            load_builtin().tokenizer, url, isl=200, turns=2, streaming=True,
            cache_bust="first_turn_prefix", request_count=8,
        )  # fmt: skip
        assert_exact(recs, 8)

        async def matches() -> dict[str, float]:
            after = await asyncio.to_thread(proxy_metrics.scrape, metrics)
            assert after is not None
            return proxy_metrics.diff(before, after).get("islwatch_isl_match_total", {})

        # Analysis runs off the response path: wait until every request has its match result.
        settled = await eventually_async(
            matches, until=lambda m: sum(m.values()) >= 8, what="the proxy's match results for 8 requests"
        )
        assert settled == {"exact": 8.0}
