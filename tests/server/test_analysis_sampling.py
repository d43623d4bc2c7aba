"""`--analysis-sample-rate`, end to end: a real proxy (worker threads, the builtin tokenizer) relays every
request, analyses a sample, and counts the rest in `islwatch_analysis_skipped_total` (never as dropped). A
skipped request is relayed as sent: no usage is injected into it."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import aiohttp
import orjson
import pytest

from proxy.server.app import run_proxy
from proxy.server.config import ConfigError
from proxy.server.inspect import Policy
from tests.server.helpers import (
    Background,
    UpstreamState,
    build_test_upstream,
    proxy_config,
    serve_app,
    settled,
    value,
    wait_metrics,
)

N = 60
# Streaming, so that with --inject-stream-usage each analysed request goes upstream asking for usage.
CHAT = {
    "model": "m",
    "messages": [{"role": "user", "content": "What is the capital of France?"}],
    "stream": True,
}


@pytest.fixture(scope="module")
def background() -> Iterator[Background]:
    bg = Background()
    yield bg
    bg.close()


def _drive(background: Background, rate: float, state: UpstreamState) -> dict[Any, float]:
    upstream = background.enter(serve_app(build_test_upstream(state)))
    config = proxy_config(upstream, analysis_sample_rate=rate, server_probe="off", inject_stream_usage=True)
    url, admin_url, _ = background.enter(run_proxy(config))

    async def go() -> dict[Any, float]:
        async with aiohttp.ClientSession() as s:
            await wait_metrics(s, admin_url, lambda m: value(m, "islwatch_analysis_workers_live") >= 1)
            for _ in range(N):
                # aiohttp's default Accept-Encoding (gzip, deflate) allows identity: usage is asked.
                async with s.post(url + "/v1/chat/completions", json=CHAT) as resp:
                    assert resp.status == 200, await resp.text()
                    await resp.read()
            return await wait_metrics(
                s,
                admin_url,
                lambda m: (
                    value(m, "islwatch_analysis_seconds_count") + value(m, "islwatch_analysis_skipped_total")
                    == N
                    and settled(m)
                ),
            )

    return background.run(go())


def _injected(state: UpstreamState) -> int:
    """Upstream requests whose body islwatch changed to ask for usage (only analysed requests need it)."""
    return sum(1 for r in state.requests if b"include_usage" in r["body"])


def test_half_rate_analyses_some_and_counts_the_rest_as_skipped(background: Background) -> None:
    state = UpstreamState(requests=[])
    m = _drive(background, 0.5, state)
    analysed = value(m, "islwatch_analysis_seconds_count")
    skipped = value(m, "islwatch_analysis_skipped_total", model="default", endpoint="chat")
    assert analysed + skipped == N
    # Each request is drawn with p=0.5: all N landing on one side has probability 2**-59.
    assert analysed > 0 and skipped > 0
    assert value(m, "islwatch_analysis_dropped_total") == 0
    assert value(m, "islwatch_requests_total", status_class="2xx") == N  # every request was relayed
    assert len(state.requests) == N
    # Only analysed requests were asked for usage; a skipped one went upstream as the client sent it.
    assert _injected(state) == analysed
    assert all(orjson.loads(r["body"]) == CHAT for r in state.requests if b"include_usage" not in r["body"])


def test_full_rate_skips_none(background: Background) -> None:
    state = UpstreamState(requests=[])
    m = _drive(background, 1.0, state)
    assert value(m, "islwatch_analysis_seconds_count") == N
    assert value(m, "islwatch_analysis_skipped_total") == 0
    assert _injected(state) == N


@pytest.mark.parametrize("rate", [0, -0.5, 1.5])
def test_rate_outside_0_1_is_refused(rate: float) -> None:
    with pytest.raises(ConfigError, match="analysis_sample_rate"):
        proxy_config("http://127.0.0.1:1", analysis_sample_rate=rate)


def test_sampling_is_seedable_and_near_the_rate() -> None:
    """Same seed, same decisions; over many draws the analysed fraction is near the rate (binomial, 6 sd)."""
    draws = 10_000

    def decisions(seed: int) -> list[bool]:
        policy = Policy(frozenset(), True, 1 << 20, False, sample_rate=0.25, rng=random.Random(seed))
        return [policy.sampled() for _ in range(draws)]

    first = decisions(7)
    assert first == decisions(7)
    assert abs(sum(first) - 0.25 * draws) < 6 * (draws * 0.25 * 0.75) ** 0.5
