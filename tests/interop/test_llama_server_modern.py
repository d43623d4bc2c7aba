"""llama-server on the modern families: tiny Qwen3 and gpt-oss GGUFs (scripts/build_tiny_gguf.sh) served by
the real llama-server, against islwatch's `llama.cpp` flavor (`load_served_model(folder, "llama.cpp")`, the
counting path of the proxy and `islwatch count`).

Every shape of modern_shapes counts exactly what llama-server reports in `usage.prompt_tokens`, or llama-server
refuses it (400) or fails on it (500) as islwatch predicts (`server_would_refuse`, `invalid_body`).

The tiny gpt-oss model's random output does not parse as gpt-oss's channels (common/parsers/gpt-oss.cpp), so
llama-server answers 500 after generating; the tests ask for `response_format: json_object`, whose grammar
makes the output parse. The prompt is built before, without it (`common_chat_params_init_gpt_oss`), which
`test_response_format_leaves_the_gpt_oss_prompt_alone` checks. A conversation ending on an assistant message
is continued in the final channel and parses as it is (llama-server cannot build that grammar after it).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from proxy.core.count import INVALID_BODY, SERVER_REFUSES
from proxy.core.model import ServedModel
from proxy.core.usage import SSEUsageParser
from tests.interop.llama_server_proc import LlamaServer
from tests.interop.modern_shapes import GPT_OSS, SHAPES, ModernShape
from tests.interop.proxy_proc import Proxy, match_counts, running_proxy, wait_for_analysis

pytestmark = pytest.mark.llama_server

SAMPLING = {"max_tokens": 1, "temperature": 0, "seed": 1}
PREDICTED = {400: SERVER_REFUSES, 500: INVALID_BODY}


def request_body(shape: ModernShape) -> dict[str, Any]:
    return {"model": "tiny", **shape.body, **SAMPLING}


def server_body(family: str, shape: ModernShape) -> dict[str, Any]:
    """What the tests send: the request, and for gpt-oss a grammar its random output parses under."""
    body = request_body(shape)
    if family == GPT_OSS and shape.body["messages"][-1].get("role") != "assistant":
        body["response_format"] = {"type": "json_object"}
    return body


def post(server: LlamaServer, path: str, body: dict[str, Any]) -> tuple[int, bytes]:
    return post_url(server.base_url, path, body)


def post_url(base_url: str, path: str, body: dict[str, Any]) -> tuple[int, bytes]:
    req = urllib.request.Request(
        f"{base_url}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


@pytest.mark.parametrize("shape", SHAPES, ids=[s.name for s in SHAPES])
def test_llama_cpp_flavor_counts_what_llama_server_reports(
    modern_server: LlamaServer, modern_model: ServedModel, modern_family: str, shape: ModernShape
) -> None:
    ours = modern_model.count("chat", request_body(shape))
    status, raw = post(modern_server, "/v1/chat/completions", server_body(modern_family, shape))
    assert status == shape.status, f"llama-server answered {status}: {raw[:300]!r}"
    if status == 200:
        server = json.loads(raw)["usage"]["prompt_tokens"]
        assert ours.expected_server == server, f"islwatch {ours.as_dict()} != llama-server {server}"
    else:
        assert ours.fallback_reason == PREDICTED[status], ours.as_dict()


STREAMED = [
    s
    for s in SHAPES
    if s.name
    in (
        "oracle_agent_5_rounds_end_tool",
        "oracle_parallel_tool_calls_then_user",
        "oracle_reasoning_effort_with_tools",
        "prefill_reasoning_only",
    )
]


@pytest.mark.parametrize("shape", STREAMED, ids=[s.name for s in STREAMED])
def test_streamed_usage_is_the_same(
    modern_server: LlamaServer, modern_model: ServedModel, modern_family: str, shape: ModernShape
) -> None:
    """The usage chunk of a stream (`stream_options.include_usage`), read by islwatch's own SSE parser."""
    body = {**server_body(modern_family, shape), "stream": True, "stream_options": {"include_usage": True}}
    status, raw = post(modern_server, "/v1/chat/completions", body)
    assert status == 200, raw[:300]
    parser = SSEUsageParser()
    parser.feed(raw)
    usage = parser.result()
    assert usage is not None
    assert (
        usage.input_tokens == modern_model.count("chat", request_body(shape), streamed=True).expected_server
    )


@pytest.fixture(scope="session")
def modern_proxy(
    request: pytest.FixtureRequest, modern_server: LlamaServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Proxy]:
    """`islwatch proxy --server-flavor llama.cpp` in front of the family's llama-server."""
    folder = request.getfixturevalue("modern_model").identity.name  # the shared folder it was loaded from
    log_path = tmp_path_factory.mktemp("islwatch-proxy-modern") / f"{modern_server.family}.log"
    with running_proxy(
        modern_server.base_url, folder, log_path, extra_args=("--server-flavor", "llama.cpp")
    ) as proxy:
        yield proxy


PROXIED = [
    s
    for s in SHAPES
    if s.name
    in (
        "oracle_agent_20_rounds_end_tool",
        "content_and_reasoning_content_with_tool_calls",
        "prefill_reasoning_and_content",
        "developers_not_merged",
    )
]


@pytest.mark.parametrize("shape", PROXIED, ids=[s.name for s in PROXIED])
def test_proxy_counts_it_exact(modern_proxy: Proxy, modern_family: str, shape: ModernShape) -> None:
    """The proxy's own analysis path (workers, fast encoder) agrees: `islwatch_isl_match_total` says exact,
    streamed and not."""
    for stream in (False, True):
        body = server_body(modern_family, shape)
        if stream:
            body |= {"stream": True, "stream_options": {"include_usage": True}}
        before = match_counts(modern_proxy, "chat")
        status, raw = post_url(modern_proxy.base_url, "/v1/chat/completions", body)
        assert status == 200, raw[:300]
        got = wait_for_analysis(modern_proxy, "chat", before, 1)
        assert got == {"exact": 1.0}, f"{shape.name} stream={stream}: {got}"


@pytest.mark.parametrize("family", [GPT_OSS])
def test_response_format_leaves_the_gpt_oss_prompt_alone(
    modern_servers: dict[str, LlamaServer], family: str
) -> None:
    server = modern_servers[family]
    for shape in SHAPES[:3] + [s for s in SHAPES if s.name == "oracle_agent_5_rounds_end_user"]:
        _, plain = post(server, "/apply-template", request_body(shape))
        _, constrained = post(server, "/apply-template", server_body(family, shape))
        assert json.loads(plain)["prompt"] == json.loads(constrained)["prompt"]


def test_the_modern_servers_are_the_tested_version(modern_servers: dict[str, LlamaServer]) -> None:
    from proxy.core.specs import TESTED_VERSIONS

    assert {s.version for s in modern_servers.values()} == {TESTED_VERSIONS["llama.cpp"]}
