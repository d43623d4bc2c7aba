"""Every shape put to vLLM's in-process oracle (tests/vllm_oracle/oracle_shapes.py: the server shapes and the
agent shapes, chat and /v1/responses) sent to each live vLLM 0.32 server, directly and through `islwatch
proxy`. Where the server answers, its `usage.prompt_tokens` is islwatch's count (`load_served_model` on the
folder the server serves) and the proxy classifies the request `exact`; where it answers 400, islwatch says
the server would refuse it (`islwatch count`'s server_would_refuse: a template error or a request-path
refusal) and the proxy relays the 400 unanalysed.

tests/vllm_oracle asserts the same of vLLM's in-process preprocessing, shape for shape, on a folder with the
same model_type, tokenizer files and `vllm serve` flags (checked here): with both green, the live server and
the oracle agree on every shape (checked directly once: 270 of 270, docs/compatibility/vllm.md). The
oracles are not asked here: they run, and are stopped, before this directory's tests (their vLLM release is
their one session-scoped parameter), and starting more would cost 1-2 GB each.
"""

from __future__ import annotations

import json
import urllib.request
from functools import cache
from typing import Any

import pytest

from proxy.core.count import INVALID_BODY, SERVER_REFUSES, TEMPLATE_ERROR, CountResult
from proxy.core.endpoints import SHAPES as ENDPOINTS
from proxy.core.model import ServedModel, load_served_model
from proxy.core.usage import usage_of
from tests.eventually import eventually
from tests.server.helpers import parse_metrics, value
from tests.vllm_oracle.oracle_proc import FAMILIES as ORACLE_FAMILIES
from tests.vllm_oracle.oracle_shapes import SHAPES
from tests.vllm_server.test_vllm_direct import request
from tests.vllm_server.vllm_proc import FAMILIES, VllmServer, post_raw
from tests.vllm_server.vllm_shapes import Shape

pytestmark = pytest.mark.vllm
REFUSED = (TEMPLATE_ERROR, SERVER_REFUSES)  # what `islwatch count` reports as server_would_refuse


@cache
def served(folder: str) -> ServedModel:
    return load_served_model(folder, "vllm")


def test_the_servers_are_the_oracles(vllm: VllmServer) -> None:
    """The live server and the family's in-process oracle are the same `vllm serve` (tool-call and reasoning
    parsers) of a folder with the same model_type."""
    oracle = ORACLE_FAMILIES[vllm.family]
    config = json.loads((vllm.model_dir / "config.json").read_text())
    assert (FAMILIES[vllm.family][1], config["model_type"]) == (oracle.serve, oracle.config["model_type"])


def metrics(admin_url: str) -> dict[Any, float]:
    with urllib.request.urlopen(admin_url + "/metrics", timeout=30) as resp:
        return parse_metrics(resp.read().decode())


def finished(samples: dict[Any, float]) -> float:
    """Analyses done, whatever their outcome (a count, a bad request, an error) or a memo's reuse."""
    reused = value(samples, "islwatch_analysis_reused_total")
    return value(samples, "islwatch_analysis_seconds_count") + reused


def relayed(samples: dict[Any, float]) -> float:
    return value(samples, "islwatch_requests_total")


def through_proxy(
    proxied: tuple[str, str], path: str, body: dict[str, Any]
) -> tuple[int, bytes, dict[str, float]]:
    """The proxy's answer, and the change in islwatch_isl_match_total{result} its analysis made (none for a
    refusal, which is relayed and not analysed)."""
    url, admin_url = proxied
    before = metrics(admin_url)
    status, raw = post_raw(url, path, body)
    done = finished if status == 200 else relayed
    after = eventually(
        lambda: metrics(admin_url),
        until=lambda m: done(m) > done(before) and value(m, "islwatch_analysis_queue_depth") == 0,
        what=f"the proxy's analysis of {path} (status {status})",
    )
    match = "islwatch_isl_match_total"
    results = {dict(labels)["result"] for name, labels in after if name == match}
    changes = {r: value(after, match, result=r) - value(before, match, result=r) for r in results}
    return status, raw, {r: d for r, d in changes.items() if d}


def says(result: CountResult) -> str:
    return f"islwatch counts {result.expected_server} ({result.fallback_reason}: {result.detail})"


@pytest.mark.parametrize("shape", SHAPES, ids=[s.name for s in SHAPES])
def test_live_server_counts_as_islwatch(vllm: VllmServer, proxied: tuple[str, str], shape: Shape) -> None:
    path = ENDPOINTS[shape.endpoint].path  # type: ignore[index]
    body = request(shape, vllm)
    status, raw = post_raw(vllm.base_url, path, body)
    answer = json.loads(raw or b"{}")
    usage = usage_of(answer) if status == 200 else None
    live = usage.input_tokens if usage is not None else None
    result = served(vllm.model).count(shape.endpoint, body)
    if status == 200:
        assert live is not None, raw[:300]
        assert result.fallback_reason is None and result.expected_server == live, (
            f"vLLM counts {live}; {says(result)}"
        )
    elif status == 400:
        assert result.fallback_reason in REFUSED, f"vLLM answers 400 ({raw[:200]!r}); {says(result)}"
    else:  # vLLM's 500s: not a request islwatch can count
        assert result.fallback_reason in (*REFUSED, INVALID_BODY), f"vLLM answers {status}; {says(result)}"

    proxy_status, proxy_raw, counted = through_proxy(proxied, path, body)
    if status == 200:
        proxy_usage = usage_of(json.loads(proxy_raw))
        assert proxy_status == 200 and proxy_usage is not None and proxy_usage.input_tokens == live
        assert counted == {"exact": 1}, counted
    else:  # relayed byte for byte, not analysed
        assert (proxy_status, proxy_raw) == (status, raw)
        assert counted == {}, counted
