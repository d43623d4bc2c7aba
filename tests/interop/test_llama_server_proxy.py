"""Phase 2: `islwatch proxy` (the real CLI, a subprocess) in front of a real llama-server.

- Every shape of interop_shapes through the proxy with the openai client, streaming and not: /metrics counts
  it `exact` (islwatch_isl_match_total{result="exact"}), or `mismatch` where docs/compatibility/llama-cpp.md documents why.
- The proxy passes llama-server's own behaviour through unchanged: error bodies, the 503 while the model
  loads, the `timings` field, usage on the finish chunk of /v1/completions streams, `data: null` events.
"""

from __future__ import annotations

import json
import re
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from openai import OpenAI

from tests.eventually import eventually
from tests.interop.interop_shapes import FIRST_PROMPT, QWEN, SHAPES, VLLM_REFUSES, Shape
from tests.interop.llama_server_proc import (
    START_DEADLINE_SECONDS,
    LlamaServer,
    free_port,
    launch,
    stop,
)
from tests.interop.proxy_proc import (
    ANALYSIS_DEADLINE_SECONDS,
    Proxy,
    match_counts,
    running_proxy,
    scrape,
    wait_for_analysis,
)
from tests.interop.test_llama_server import create, request_body

pytestmark = pytest.mark.llama_server


@pytest.fixture(scope="session")
def proxied_client(llama_proxy: Proxy) -> OpenAI:
    return OpenAI(base_url=f"{llama_proxy.base_url}/v1", api_key="sk-none", max_retries=0)


def expected_result(shape: Shape, family: str, streamed: bool) -> str:
    """Documented divergences mismatch under the default (vLLM) flavor. A list of prompts (FIRST_PROMPT)
    mismatches only when not streamed: streamed, each prompt's usage rides on its own finish chunk and the
    proxy sums them (docs: list-of-prompts-usage-is-the-first-prompts)."""
    cause = shape.diverges.get(family)
    if cause is None or (cause == FIRST_PROMPT and streamed):
        return "exact"
    return "mismatch"


def refused_count(proxy: Proxy) -> float:
    key = ("islwatch_bad_requests_total", (("reason", "server_refuses"),))
    return scrape(proxy).get(key, 0.0)


@pytest.mark.parametrize("shape", SHAPES, ids=[s.name for s in SHAPES])
def test_proxied_shape_is_counted(
    proxied_client: OpenAI, llama_proxy: Proxy, family: str, shape: Shape
) -> None:
    if shape.diverges.get(family) == VLLM_REFUSES:  # the default flavor says vLLM refuses: counted as such
        before_refused = refused_count(llama_proxy)
        assert create(proxied_client, shape).usage is not None  # llama-server answers; relayed as it is
        eventually(
            lambda: refused_count(llama_proxy),
            until=lambda n: n >= before_refused + 1,
            timeout=ANALYSIS_DEADLINE_SECONDS,
            what="a server_refuses count",
        )
        return
    before = match_counts(llama_proxy, shape.endpoint)
    resp = create(proxied_client, shape)
    assert resp.usage is not None
    nonstream = wait_for_analysis(llama_proxy, shape.endpoint, before, 1)

    before = match_counts(llama_proxy, shape.endpoint)
    events = list(create(proxied_client, shape, stream=True, stream_options={"include_usage": True}))
    assert any(e is not None and e.usage is not None for e in events)
    streamed = wait_for_analysis(llama_proxy, shape.endpoint, before, 1)

    assert nonstream == {expected_result(shape, family, False): 1.0}, (
        f"non-streaming {shape.name}: {nonstream}"
    )
    assert streamed == {expected_result(shape, family, True): 1.0}, f"streaming {shape.name}: {streamed}"


@pytest.mark.parametrize("shape", SHAPES, ids=[s.name for s in SHAPES])
def test_llama_cpp_flavor_makes_every_shape_exact(
    llama_cpp_flavor_proxy: Proxy, family: str, shape: Shape
) -> None:
    """With `--server-flavor llama.cpp` islwatch predicts llama-server's own preparation: every documented
    divergence (NFC, prefill, rebuilt tools, %g floats, first-prompt usage) is counted exactly."""
    client = OpenAI(base_url=f"{llama_cpp_flavor_proxy.base_url}/v1", api_key="sk-none", max_retries=0)
    for stream in (False, True):
        before = match_counts(llama_cpp_flavor_proxy, shape.endpoint)
        if stream:
            list(create(client, shape, stream=True, stream_options={"include_usage": True}))
        else:
            create(client, shape)
        got = wait_for_analysis(llama_cpp_flavor_proxy, shape.endpoint, before, 1)
        assert got == {"exact": 1.0}, f"{shape.name} stream={stream}: {got}"


# ---- llama-server's own behaviour, byte for byte -------------------------------------------------------

VOLATILE = [
    (re.compile(rb'"id":"[^"]*"'), b'"id":"-"'),
    (re.compile(rb'"created":\d+'), b'"created":0'),
    (re.compile(rb'"timings":\{[^{}]*\}'), b'"timings":{}'),  # per-request milliseconds
]


def normalized(body: bytes) -> bytes:
    for pattern, repl in VOLATILE:
        body = pattern.sub(repl, body)
    return body


def post(base_url: str, path: str, body: bytes) -> tuple[int, str, bytes]:
    req = urllib.request.Request(
        f"{base_url}{path}", data=body, headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, resp.headers.get("Content-Type", ""), resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.headers.get("Content-Type", ""), err.read()


ERROR_BODIES = {
    "truncated_json": (b'{"model": "m", "messages": [', "/v1/chat/completions"),
    "no_messages": (b'{"model": "m"}', "/v1/chat/completions"),
    "bad_role_content": (b'{"messages": [{"role": "user"}]}', "/v1/chat/completions"),
    "prompt_not_text": (b'{"prompt": {"a": 1}}', "/v1/completions"),
}


@pytest.mark.parametrize("case", list(ERROR_BODIES), ids=list(ERROR_BODIES))
def test_error_bodies_pass_through(llama_server: LlamaServer, llama_proxy: Proxy, case: str) -> None:
    body, path = ERROR_BODIES[case]
    direct = post(llama_server.base_url, path, body)
    proxied = post(llama_proxy.base_url, path, body)
    assert direct[0] >= 400
    assert proxied == direct


def raw_body(shape: Shape, stream: bool) -> bytes:
    body: dict[str, Any] = {**request_body(shape), "cache_prompt": False}  # same timings shape both ways
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    return json.dumps(body).encode()


BYTE_SHAPES = [
    s for s in SHAPES if s.name in {"single_turn", "tool_call_and_result", "prompt_string", "prompt_list"}
]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("shape", BYTE_SHAPES, ids=[s.name for s in BYTE_SHAPES])
def test_responses_pass_through_byte_for_byte(
    llama_server: LlamaServer, llama_proxy: Proxy, shape: Shape, stream: bool
) -> None:
    """temperature 0 + seed: the text is deterministic, so direct and proxied bytes are equal once ids,
    timestamps and per-request milliseconds are masked. Covers `timings`, usage on the completions
    finish chunk, and the `data: null` event of a list of prompts."""
    path = "/v1/chat/completions" if shape.endpoint == "chat" else "/v1/completions"
    body = raw_body(shape, stream)
    direct = post(llama_server.base_url, path, body)
    proxied = post(llama_proxy.base_url, path, body)
    assert direct[0] == proxied[0] == 200
    assert proxied[1] == direct[1]
    assert normalized(proxied[2]) == normalized(direct[2])
    assert b'"timings":{' in proxied[2]
    if stream and shape.endpoint == "completions":
        finish = [e for e in proxied[2].split(b"\n\n") if b'"finish_reason":"' in e]
        assert finish and all(b'"usage":{' in e for e in finish)
        assert proxied[2].count(b"data: null\n\n") == (1 if shape.name == "prompt_list" else 0)


def test_loading_503_passes_through(
    llama_server_binary: str, llama_servers: dict[str, LlamaServer], tmp_path: Path
) -> None:
    """A fresh llama-server behind a fresh proxy: while the model loads, clients see the server's own 503
    (one model is enough: the loading phase is the server's, not the model's)."""
    port = free_port()
    gguf = llama_servers[QWEN].gguf
    # /health is not analysed; the offline built-in tokenizer keeps the proxy's start-up short.
    with running_proxy(f"http://127.0.0.1:{port}", "builtin:mistral-v0.1", tmp_path / "proxy.log") as proxy:
        proc = launch(llama_server_binary, gguf, port, tmp_path / "llama.log")
        try:
            seen = poll_health(proxy.base_url, proc)
        finally:
            stop(proc)
    loading = [body for status, _, body in seen if status == 503]
    assert loading, f"never saw the loading phase through the proxy: {[s for s, _, _ in seen]}"
    assert loading[0] == b'{"error":{"message":"Loading model","type":"unavailable_error","code":503}}'
    assert seen[-1][0] == 200


def poll_health(base_url: str, proc: subprocess.Popen[bytes]) -> list[tuple[int, str, bytes]]:
    """GET /health through the proxy until 200 (or llama-server exits); the distinct (status, content type,
    body) answers seen. No pause between polls, so the short loading phase is not missed."""
    seen: list[tuple[int, str, bytes]] = []

    def probe() -> int | None:  # None once llama-server exited
        if proc.poll() is not None:
            return None
        try:
            with urllib.request.urlopen(f"{base_url}/health", timeout=5) as resp:
                answer = (resp.status, resp.headers.get("Content-Type", ""), resp.read())
        except urllib.error.HTTPError as err:
            answer = (err.code, err.headers.get("Content-Type", ""), err.read())
        except (urllib.error.URLError, ConnectionError):
            answer = (0, "", b"")
        if not seen or seen[-1] != answer:
            seen.append(answer)
        return answer[0]

    eventually(
        probe,
        until=lambda status: status is None or status == 200,
        timeout=START_DEADLINE_SECONDS,
        what="/health through the proxy answering 200",
        interval=0,
    )
    return seen
