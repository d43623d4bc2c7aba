"""The same shapes through `islwatch proxy` in front of the real vLLM server: every answered shape streamed
(SSE with include_usage) and every embedding is counted `exact` in /metrics; a refusal is relayed byte for
byte and not analysed. Every shape as JSON through the proxy is test_vllm_oracle_shapes.py.
"""

from __future__ import annotations

import urllib.request
from typing import Any

import pytest

from proxy.core.endpoints import SHAPES
from tests.eventually import eventually
from tests.server.helpers import parse_metrics, value
from tests.vllm_server.test_vllm_direct import STREAMABLE, request
from tests.vllm_server.vllm_proc import VllmServer, post_raw
from tests.vllm_server.vllm_shapes import EMBEDDINGS, TEMPLATE_REFUSES, Shape

pytestmark = pytest.mark.vllm


def metrics(admin_url: str) -> dict[Any, float]:
    with urllib.request.urlopen(admin_url + "/metrics", timeout=30) as resp:
        return parse_metrics(resp.read().decode())


def analysed(samples: dict[Any, float]) -> float:
    return value(samples, "islwatch_isl_match_total")


def send_and_classify(url: str, admin_url: str, shape: Shape, body: dict[str, Any]) -> dict[str, float]:
    """Send one request through the proxy; the per-result change of islwatch_isl_match_total it caused."""
    before = metrics(admin_url)
    status, raw = post_raw(url, SHAPES[shape.endpoint].path, body)  # type: ignore[index]
    assert status == 200, raw[:300]
    after = eventually(
        lambda: metrics(admin_url),
        until=lambda m: analysed(m) > analysed(before) and value(m, "islwatch_analysis_queue_depth") == 0,
        what=f"the analysis of {shape.name}",
    )
    results = ("exact", "mismatch", "no_server_count", "no_template")
    return {
        r: value(after, "islwatch_isl_match_total", result=r)
        - value(before, "islwatch_isl_match_total", result=r)
        for r in results
        if value(after, "islwatch_isl_match_total", result=r)
        != value(before, "islwatch_isl_match_total", result=r)
    }


@pytest.mark.parametrize("shape", STREAMABLE, ids=[s.name for s in STREAMABLE])
def test_sse_through_the_proxy_is_exact(vllm: VllmServer, proxied: tuple[str, str], shape: Shape) -> None:
    url, admin_url = proxied
    body = request(shape, vllm, stream=True, stream_options={"include_usage": True})
    if shape.name in TEMPLATE_REFUSES.get(vllm.family, ()):
        relayed_not_analysed(vllm, proxied, shape, body)
    else:
        assert send_and_classify(url, admin_url, shape, body) == {"exact": 1}


@pytest.mark.parametrize("shape", EMBEDDINGS, ids=[s.name for s in EMBEDDINGS])
def test_embeddings_through_the_proxy_are_exact(
    vllm_embed: VllmServer, proxies: dict[str, tuple[str, str]], shape: Shape
) -> None:
    url, admin_url = proxies[f"{vllm_embed.family}-embed"]
    assert send_and_classify(url, admin_url, shape, request(shape, vllm_embed)) == {"exact": 1}


def relayed_not_analysed(
    vllm: VllmServer, proxied: tuple[str, str], shape: Shape, body: dict[str, Any]
) -> None:
    """A request the server refuses: the proxy relays its 400 byte for byte and does not analyse it."""
    url, admin_url = proxied
    path = SHAPES[shape.endpoint].path  # type: ignore[index]
    direct = post_raw(vllm.base_url, path, body)
    before = metrics(admin_url)
    through = post_raw(url, path, body)
    assert through == direct and direct[0] == 400
    relayed = eventually(
        lambda: metrics(admin_url),
        until=lambda m: (
            value(m, "islwatch_requests_total", status_class="4xx")
            > value(before, "islwatch_requests_total", status_class="4xx")
        ),
        what="the refusal counted as a 4xx request",
    )
    assert analysed(relayed) == analysed(before)
