"""The server parity probe in the proxy: at start it asks the upstream's /tokenize for the probe texts and
compares ids; the verdict is `islwatch_server_parity_ok{model}` and names the cause of otherwise unexplained
drift. The upstream here answers /tokenize with a real tokenizer's ids (vLLM's request shape), or with them
perturbed, or not at all. (Real servers: tests/vllm_server, tests/interop.)"""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson
from aiohttp import web
from prometheus_client import CollectorRegistry

from proxy.server.admin import PROBE
from proxy.server.app import run_proxy
from tests.conftest import load_builtin
from tests.eventually import eventually_async
from tests.server.helpers import fetch_metrics, proxy_config, serve_app, value


def upstream(mode: str, seen: list[str]) -> web.Application:
    """mode: same (the tokenizer's ids), shifted (each id + 1), none (no /tokenize)."""
    tok = load_builtin().tokenizer

    async def tokenize(request: web.Request) -> web.Response:
        body = await request.json()
        seen.append(body.get("prompt", body.get("content", "")))
        if mode == "none" or "prompt" not in body:
            return web.Response(status=404)
        ids = tok(body["prompt"], add_special_tokens=body["add_special_tokens"])["input_ids"]
        ids = [i + 1 for i in ids] if mode == "shifted" else ids
        return web.json_response({"tokens": ids, "count": len(ids), "max_model_len": 4096})

    async def chat(request: web.Request) -> web.Response:
        # Two tokens more than islwatch expects: too few for any arithmetic signature (`unknown` drift).
        body = await request.json()
        n = len(
            tok.apply_chat_template(body["messages"], tokenize=True, add_generation_prompt=True)["input_ids"]
        )
        usage = {"prompt_tokens": n + 2, "completion_tokens": 1, "total_tokens": n + 3}
        answer = {"id": "x", "object": "chat.completion", "choices": [], "usage": usage}
        return web.Response(body=orjson.dumps(answer), content_type="application/json")

    app = web.Application()
    app.router.add_post("/tokenize", tokenize)
    app.router.add_post("/v1/chat/completions", chat)
    return app


async def probed(
    mode: str, **config: Any
) -> tuple[dict[Any, float], dict[str, Any], list[str], dict[Any, float]]:
    """Start the proxy in front of such an upstream, wait for one probe round, send one drifting chat."""
    seen: list[str] = []
    async with serve_app(upstream(mode, seen)) as up:
        cfg = proxy_config(up, **config)
        async with (
            run_proxy(cfg, CollectorRegistry()) as (url, admin_url, admin),
            aiohttp.ClientSession() as s,
        ):
            if PROBE in admin:
                await eventually_async(lambda: admin[PROBE].runs >= 1, what="one probe round")
            before = await fetch_metrics(s, admin_url)
            async with s.get(admin_url + "/readyz") as r:
                ready = await r.json()
            body = {"model": "m", "messages": [{"role": "user", "content": "Hello there"}]}
            async with s.post(url + "/v1/chat/completions", json=body) as r:
                assert r.status == 200
            after = await eventually_async(
                lambda: fetch_metrics(s, admin_url),
                until=lambda m: value(m, "islwatch_drift_total") >= 1,
                what="the chat's drift cause",
            )
    return before, ready, seen, after


async def test_equal_ids_mean_parity() -> None:
    before, ready, seen, after = await probed("same")
    assert value(before, "islwatch_server_parity_ok", model="default") == 1
    assert ready["server_parity"] == {"default": "ok"}
    assert "Return the word READY." in seen
    assert value(after, "islwatch_drift_total", cause="unknown") == 1  # parity holds: still unexplained


async def test_differing_ids_name_the_cause() -> None:
    before, ready, _, after = await probed("shifted")
    assert ("islwatch_server_parity_ok", frozenset({("model", "default")})) in before
    assert value(before, "islwatch_server_parity_ok", model="default") == 0
    assert ready["server_parity"] == {"default": "differs"}
    assert value(after, "islwatch_drift_total", cause="server_tokenizer_differs") == 1
    assert value(after, "islwatch_drift_total", cause="unknown") == 0


async def test_no_tokenize_is_unknown_not_a_failure() -> None:
    before, ready, seen, after = await probed("none")
    assert seen  # it asked
    assert not [k for k in before if k[0] == "islwatch_server_parity_ok"]
    assert ready["server_parity"] == {"default": "unknown"} and ready["status"] == "ready"
    assert value(after, "islwatch_drift_total", cause="unknown") == 1


async def test_probe_off_sends_nothing() -> None:
    _, ready, seen, _ = await probed("same", server_probe="off")
    assert seen == [] and "server_parity" not in ready
