"""The Anthropic Messages API on a real vLLM 0.32 server (Qwen3, Llama 3.1): `/v1/messages` as JSON and
streamed, and `/v1/messages/count_tokens`, for every shape of tests/anthropic_shapes.py, directly and through
the proxy. The Llama 3.1 server runs with prefix caching and prompt-token details (vllm_proc.py BILLED_FAMILY):
there `usage.input_tokens` leaves out the cached part of the prompt (anthropic/serving.py
`_build_anthropic_usage`), and islwatch's count must equal input + cache read, never drift on a cache hit.
The in-process oracle (tests/vllm_oracle/test_vllm_messages.py) runs the same shapes on every family; this
proves the oracle is the server.
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any

import pytest

from proxy.core.count import SERVER_REFUSES, TEMPLATE_ERROR, CountResult
from proxy.core.model import ServedModel, load_served_model
from proxy.core.usage import SSEUsageParser, usage_from_json_bytes
from tests.anthropic_shapes import SHAPES, MessagesShape
from tests.eventually import eventually
from tests.server.helpers import value
from tests.vllm_server.test_vllm_proxy import metrics
from tests.vllm_server.vllm_proc import BILLED_FAMILY, VllmServer, post_raw

pytestmark = pytest.mark.vllm
PATH, COUNT_PATH = "/v1/messages", "/v1/messages/count_tokens"
THROUGH_PROXY = ("plain_string", "system_billing_header", "tool_use_and_result", "agent_loop_8_then_user")


@cache
def served(model_dir: str) -> ServedModel:
    """islwatch given the folder the server serves, as a deployment gives it."""
    return load_served_model(model_dir, "vllm")


def body_of(shape: MessagesShape, server: VllmServer, **extra: Any) -> dict[str, Any]:
    return {**shape.body, "model": server.model, "max_tokens": 1, "temperature": 0, **extra}


def prompt(usage: dict[str, Any]) -> int:
    return int(
        usage["input_tokens"] + (usage.get("cache_read_input_tokens") or 0)
        + (usage.get("cache_creation_input_tokens") or 0)
    )  # fmt: skip


def refused(ours: CountResult, status: int, raw: bytes) -> None:
    assert 400 <= status < 500, raw[:300]
    assert ours.fallback_reason in (SERVER_REFUSES, TEMPLATE_ERROR), (raw[:200], ours.as_dict())


@pytest.mark.parametrize("shape", SHAPES, ids=[s.name for s in SHAPES])
def test_messages_json_and_count_tokens(vllm: VllmServer, shape: MessagesShape) -> None:
    body = body_of(shape, vllm)
    ours = served(vllm.model).count("messages", body)
    status, raw = post_raw(vllm.base_url, PATH, body)
    if status != 200:
        refused(ours, status, raw)
        return
    usage = json.loads(raw)["usage"]
    assert ours.expected_server == prompt(usage), (ours.as_dict(), usage)
    read = usage_from_json_bytes(raw)  # islwatch's own reading, as the proxy reads it
    assert read is not None and read.input_tokens == prompt(usage)
    counted = {k: v for k, v in body.items() if k not in ("max_tokens", "temperature")}
    status, raw = post_raw(vllm.base_url, COUNT_PATH, counted)
    assert status == 200, raw[:300]
    assert (
        json.loads(raw)["input_tokens"] == served(vllm.model).count("count_tokens", counted).expected_server
    )


@pytest.mark.parametrize("shape", SHAPES, ids=[s.name for s in SHAPES])
def test_messages_streamed(vllm: VllmServer, shape: MessagesShape) -> None:
    body = body_of(shape, vllm, stream=True)
    ours = served(vllm.model).count("messages", body, True)
    status, raw = post_raw(vllm.base_url, PATH, body)
    if status != 200:
        refused(ours, status, raw)
        return
    parser = SSEUsageParser()
    parser.feed(raw)
    usage = parser.result()
    assert usage is not None and usage.input_tokens == ours.expected_server, (usage, ours.as_dict())


def test_cache_hits_are_not_drift(vllm_servers: dict[str, VllmServer]) -> None:
    """The same long conversation twice on the server with prefix caching and prompt-token details (the
    billed one): the second answer reports most of its prompt as read from the cache, and input + cache read
    is still islwatch's count."""
    vllm = vllm_servers[BILLED_FAMILY]
    shape = next(s for s in SHAPES if s.name == "agent_loop_8_then_user")
    body = body_of(shape, vllm)
    ours = served(vllm.model).count("messages", body)
    usages = []
    for _ in range(2):
        status, raw = post_raw(vllm.base_url, PATH, body)
        assert status == 200, raw[:300]
        usages.append(json.loads(raw)["usage"])
    assert usages[1]["cache_read_input_tokens"] > 0, usages
    assert usages[1]["input_tokens"] < ours.expected_server
    assert [prompt(u) for u in usages] == [ours.expected_server] * 2


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_through_the_proxy_is_exact(vllm: VllmServer, proxied: tuple[str, str], stream: bool) -> None:
    url, admin = proxied
    before = metrics(admin)
    for name in THROUGH_PROXY:
        shape = next(s for s in SHAPES if s.name == name)
        for _ in range(2):  # the second time from the prefix cache, where the server has one
            status, raw = post_raw(url, PATH, body_of(shape, vllm, stream=stream))
            assert status == 200, raw[:300]
    sent = 2 * len(THROUGH_PROXY)

    def exact(m: dict[Any, float]) -> float:
        return value(m, "islwatch_isl_match_total", endpoint="messages", result="exact") - value(
            before, "islwatch_isl_match_total", endpoint="messages", result="exact"
        )

    after = eventually(lambda: metrics(admin), until=lambda m: exact(m) >= sent, what="the Messages analyses")
    assert exact(after) == sent
    assert value(after, "islwatch_isl_match_total", endpoint="messages", result="mismatch") == value(
        before, "islwatch_isl_match_total", endpoint="messages", result="mismatch"
    )
