"""The rest of usage as metrics, end to end: real servers' answers (llama-server recordings, vLLM captures)
relayed by a real proxy, JSON and SSE, chat, completions and /v1/responses, analysed by worker threads and by
worker processes (the usage crosses the pipe frames). The histograms' sums and counts equal the usage each
answer carried, and `islwatch_usage_fields_total` tells a reported zero from a field never reported."""

from __future__ import annotations

from collections.abc import Iterator

import aiohttp
import pytest
from aiohttp import web

from proxy.server.app import run_proxy
from tests.core.test_usage_fields import VLLM_CHAT_STREAM, VLLM_RESPONSES_STREAM
from tests.lanes import sweep
from tests.server.helpers import (
    MODE_HEADER,
    Background,
    UpstreamState,
    build_test_upstream,
    proxy_config,
    serve_app,
    settled,
    value,
    wait_metrics,
)

CHAT = {"model": "m", "messages": [{"role": "user", "content": "What is the capital of France?"}]}
COMPLETION = {"model": "m", "prompt": "The sky is"}
# (path, body, how the upstream answers). The llama-server recordings' usage: chat 33 prompt, 3 output, 0
# cached (JSON) / 32 cached (the stream, recorded second); completions 3 prompt, 3 output, 0 / 2 cached.
# vLLM's: the chat stream 174 prompt, 3 output, 128 cached, no completion_tokens_details; the responses stream
# 36 input, 2 output, 0 cached, 0 reasoning.
TRAFFIC = [
    ("/v1/chat/completions", CHAT, "replay:qwen2.5-instruct.chat_nonstream"),
    ("/v1/chat/completions", {**CHAT, "stream": True}, "replay:qwen2.5-instruct.chat_stream_include_usage"),
    ("/v1/completions", COMPLETION, "replay:qwen2.5-instruct.completions_nonstream"),
    (
        "/v1/completions",
        {**COMPLETION, "stream": True},
        "replay:qwen2.5-instruct.completions_stream_include_usage",
    ),
    ("/v1/chat/completions", {**CHAT, "stream": True}, "vllm:chat"),
    ("/v1/responses", {"model": "m", "input": "Hello there, how are you?", "stream": True}, "vllm:responses"),
    ("/v1/chat/completions", CHAT, "no-usage"),
]
# field -> (reported, not reported), over the seven answers above
FIELDS = {
    "prompt_tokens": (6, 1),
    "output_tokens": (6, 1),
    "cached_prompt_tokens": (6, 1),
    "reasoning_tokens": (1, 6),
}
# (metric, endpoint) -> (count, sum)
PER_REQUEST = {
    ("islwatch_output_tokens", "chat"): (3, 3 + 3 + 3),
    ("islwatch_output_tokens", "completions"): (2, 3 + 3),
    ("islwatch_output_tokens", "responses"): (1, 2),
    ("islwatch_cached_prompt_tokens", "chat"): (3, 0 + 32 + 128),
    ("islwatch_cached_prompt_tokens", "completions"): (2, 0 + 2),
    ("islwatch_cached_prompt_tokens", "responses"): (1, 0),
    ("islwatch_reasoning_tokens", "chat"): (0, 0),
    ("islwatch_reasoning_tokens", "completions"): (0, 0),
    ("islwatch_reasoning_tokens", "responses"): (1, 0),
}


@pytest.fixture(scope="module")
def background() -> Iterator[Background]:
    bg = Background()
    yield bg
    bg.close()


def upstream_app() -> web.Application:
    """The recordings (tests/server/helpers.py), and vLLM's captured streams served as vLLM wrote them."""
    replay = next(iter(build_test_upstream(UpstreamState(requests=[])).router.routes())).handler
    streams = {"vllm:chat": VLLM_CHAT_STREAM, "vllm:responses": VLLM_RESPONSES_STREAM}

    async def handle(request: web.Request) -> web.StreamResponse:
        lines = streams.get(request.headers.get(MODE_HEADER, ""))
        if lines is None:
            return await replay(request)
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for line in lines:
            await resp.write(line.encode())
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    return app


@pytest.mark.parametrize("mode", sweep(["thread", "process"]))
def test_usage_metrics_equal_the_usage_answered(background: Background, mode: str) -> None:
    upstream = background.enter(serve_app(upstream_app()))
    url, admin_url, _ = background.enter(
        run_proxy(proxy_config(upstream, analysis_mode=mode, server_probe="off"))
    )

    async def drive() -> dict:
        async with aiohttp.ClientSession() as s:
            for path, body, answer in TRAFFIC:
                async with s.post(url + path, json=body, headers={MODE_HEADER: answer}) as resp:
                    assert resp.status == 200, await resp.text()
                    await resp.read()
            return await wait_metrics(
                s,
                admin_url,
                lambda m: (
                    value(m, "islwatch_usage_fields_total", field="prompt_tokens") == len(TRAFFIC)
                    and settled(m)
                ),
            )

    m = background.run(drive())
    for field_name, (reported, missing) in FIELDS.items():
        assert value(m, "islwatch_usage_fields_total", field=field_name, present="true") == reported, (
            field_name
        )
        assert value(m, "islwatch_usage_fields_total", field=field_name, present="false") == missing, (
            field_name
        )
    for (metric, endpoint), (count, total) in PER_REQUEST.items():
        got = (value(m, metric + "_count", endpoint=endpoint), value(m, metric + "_sum", endpoint=endpoint))
        assert got == (count, total), (metric, endpoint)
    assert value(m, "islwatch_isl_tokens_sum", kind="server") == 33 + 33 + 3 + 3 + 174 + 36
