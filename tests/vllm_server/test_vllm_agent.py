"""`--workload agent` against the live vLLM servers, through the proxy: every request of every agent
conversation (reasoning and tool calls each round, tool results) is served at exactly its target, as vLLM's
usage.prompt_tokens says, and the proxy calls each one exact; over chat and over the Anthropic Messages API.

The loadgen budgets on the folder the server serves (its config.json's model_type picks the renderer as
vLLM does), so this is the agent workload's budget checked against vLLM's own preparation and tokenizer, not
against islwatch's emulator.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from loadgen.config import LoadgenConfig
from loadgen.send import proxy_metrics
from loadgen.send.runner import Engine
from loadgen.workload.sources import build_workload
from proxy.core.model import load_served_model
from tests.eventually import eventually
from tests.vllm_server.vllm_proc import VllmServer

pytestmark = pytest.mark.vllm

ISL, ROUND, ROUNDS, CONVERSATIONS = 1000, 200, 3, 2  # ISL above the tools and Llama 3.1 system header


def matches(admin_url: str, before: dict[str, Any]) -> dict[str, float]:
    after = proxy_metrics.scrape(f"{admin_url}/metrics")
    assert after is not None
    return proxy_metrics.diff(before, after).get("islwatch_isl_match_total", {})


@pytest.mark.parametrize("endpoint", ["chat", "messages"])
@pytest.mark.parametrize("streaming", [False, True], ids=["json", "sse"])
def test_agent_rounds_are_served_at_their_targets(
    vllm: VllmServer, proxied: tuple[str, str], streaming: bool, endpoint: str
) -> None:
    """`messages`: the Anthropic Messages API, vLLM converting each round into its chat request; its
    server count is input_tokens plus the prefix-cache reads (the billed server has caching on)."""
    url, admin_url = proxied
    folder = str(vllm.model)
    requests = CONVERSATIONS * (ROUNDS + 1)
    cfg = LoadgenConfig(
        url=url, model=vllm.model, tokenizer=folder, workload="agent", isl=ISL, round_isl=ROUND,
        agent_rounds=ROUNDS, tools=3, parallel_calls=2, osl=4, concurrency=2, request_count=requests,
        streaming=streaming, run_id=f"agent-{vllm.family}-{endpoint}-{streaming}", cache_bust="first_turn_prefix",
        endpoint=endpoint,
    )  # fmt: skip
    before = proxy_metrics.scrape(f"{admin_url}/metrics")
    assert before is not None
    cfg, workload = build_workload(load_served_model(folder).tokenizer, cfg)
    records = asyncio.run(Engine(cfg, workload).run())
    assert len(records) == requests
    for r in records:
        assert r.error is None and r.budget_error is None, (vllm.family, r)
        assert r.server_prompt_tokens == r.target_isl == ISL + (r.turn - 1) * ROUND, (vllm.family, r)
    settled = eventually(
        lambda: matches(admin_url, before),
        until=lambda m: sum(m.values()) >= requests,
        what=f"{vllm.family}: {requests} match results",
    )
    assert settled == {"exact": float(requests)}, vllm.family
