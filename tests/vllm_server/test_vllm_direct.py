"""islwatch's count (default `vllm` flavor) against a real vLLM 0.32 server's `usage.prompt_tokens`: every
shape of tests/vllm_server/vllm_shapes.py streamed, embeddings, the real `openai` client and the `islwatch
count` command. The server is the oracle: its own preparation, template engine and tokenizer. Every shape as
JSON, directly and through the proxy, is test_vllm_oracle_shapes.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest
from openai import OpenAI

from proxy.core.count import TEMPLATE_ERROR, count_request
from proxy.core.endpoints import SHAPES
from proxy.core.usage import SSEUsageParser, usage_of
from tests.conftest import REPO, TEST_TOKENIZERS
from tests.vllm_server.vllm_proc import VllmServer, post, post_raw
from tests.vllm_server.vllm_shapes import ANSWERED, EMBEDDINGS, TEMPLATE_REFUSES, Shape

pytestmark = pytest.mark.vllm
STREAMABLE = [s for s in ANSWERED if SHAPES[s.endpoint].include_usage]  # type: ignore[index]


def request(shape: Shape, server: VllmServer, **extra: Any) -> dict[str, Any]:
    cap = SHAPES[shape.endpoint].max_tokens_fields  # type: ignore[index]
    body: dict[str, Any] = {**shape.body, "model": server.model, "temperature": 0, **extra}
    if cap:
        body[cap[-1]] = 16 if shape.endpoint == "responses" else 1  # responses: vLLM's minimum is 16
    return body


def server_count(server: VllmServer, shape: Shape) -> int:
    status, answer = post(server.base_url, SHAPES[shape.endpoint].path, request(shape, server))  # type: ignore[index]
    assert status == 200, answer
    usage = usage_of(answer)
    assert usage is not None, answer
    return usage.input_tokens


@pytest.mark.parametrize("shape", STREAMABLE, ids=[s.name for s in STREAMABLE])
def test_streamed_usage_exact(vllm: VllmServer, family_tokenizer: Any, shape: Shape) -> None:
    body = request(shape, vllm, stream=True, stream_options={"include_usage": True})
    status, raw = post_raw(vllm.base_url, SHAPES[shape.endpoint].path, body)  # type: ignore[index]
    counted = count_request(family_tokenizer, shape.endpoint, shape.body)
    if shape.name in TEMPLATE_REFUSES.get(vllm.family, ()):
        assert status == 400 and counted.fallback_reason == TEMPLATE_ERROR, raw[:300]
        return
    assert status == 200, raw[:300]
    parser = SSEUsageParser()
    parser.feed(raw)
    usage = parser.result()
    assert usage is not None
    assert usage.input_tokens == counted.expected_server


@pytest.mark.parametrize("shape", EMBEDDINGS, ids=[s.name for s in EMBEDDINGS])
def test_embeddings_exact(vllm_embed: VllmServer, shape: Shape) -> None:
    from tests.conftest import load_shared

    tok = load_shared(vllm_embed.family).tokenizer
    assert count_request(tok, "embeddings", shape.body).expected_server == server_count(vllm_embed, shape)


OPENAI_SHAPES = [s for s in ANSWERED if s.name in ("single_turn", "developer", "tools_minimal", "documents")]


@pytest.mark.parametrize("shape", OPENAI_SHAPES, ids=[s.name for s in OPENAI_SHAPES])
def test_openai_client_usage_exact(vllm: VllmServer, family_tokenizer: Any, shape: Shape) -> None:
    client = OpenAI(base_url=vllm.base_url + "/v1", api_key="none", max_retries=0)
    body = shape.body
    extra = {k: v for k, v in body.items() if k not in ("messages", "tools")}
    resp = client.chat.completions.create(
        model=vllm.model,
        messages=body["messages"],
        tools=body.get("tools", []) or None,  # type: ignore[arg-type]
        max_tokens=1,
        temperature=0,
        extra_body=extra or None,
    )
    assert resp.usage is not None
    assert resp.usage.prompt_tokens == count_request(family_tokenizer, "chat", body).expected_server


CLI_SHAPES = [s for s in ANSWERED if s.name in ("developer_after_system", "tools_minimal", "input_items")]


@pytest.mark.parametrize("shape", CLI_SHAPES, ids=[s.name for s in CLI_SHAPES])
def test_count_command_with_vllm_flavor(vllm: VllmServer, shape: Shape) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "proxy.cli", "count", "--tokenizer", str(TEST_TOKENIZERS / vllm.family),
         "--server-flavor", "vllm", "--endpoint", shape.endpoint, "-"],
        input=json.dumps(shape.body), capture_output=True, text=True, cwd=REPO, check=True, timeout=300,
    )  # fmt: skip
    assert json.loads(out.stdout)["expected_server"] == server_count(vllm, shape)


def test_the_server_is_the_tested_version(vllm: VllmServer) -> None:
    """The flavor is pinned to the version tested; deploy/ runs the same (tests/ops)."""
    from proxy.core.specs import TESTED_VERSIONS

    assert vllm.version == TESTED_VERSIONS["vllm"]
