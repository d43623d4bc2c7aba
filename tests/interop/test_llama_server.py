"""Phase 1: islwatch's counting core against a real llama-server's usage.prompt_tokens, with the real openai
client, on both tiny models, for every shape in interop_shapes (non-streaming and streaming).

A shape counts exactly, or it is a documented divergence (docs/compatibility/llama-cpp.md): then islwatch's
count differs and islwatch's core applied to llama-server's own message preparation (llama_cpp_model) equals
the server. Either way the test fails if the server's behaviour changes.
"""

from __future__ import annotations

import urllib.request
from typing import Any

import pytest
from openai import OpenAI
from tokenizers import Tokenizer

from proxy.core.count import SERVER_REFUSES, count_request
from tests.interop.interop_shapes import CHAT, COMPLETIONS, FIRST_PROMPT, SHAPES, VLLM_REFUSES, Shape
from tests.interop.llama_cpp_model import (
    llama_cpp_chat_count,
    llama_cpp_nonstream_usage,
    llama_cpp_prompt_counts,
    unnormalized,
)
from tests.interop.llama_server_proc import LlamaServer

pytestmark = pytest.mark.llama_server

# Deterministic output (temperature 0, fixed seed) and short: only the prompt side is under test.
SAMPLING = {"max_tokens": 2, "temperature": 0, "seed": 1}


@pytest.fixture(scope="session")
def raw_tokenizer(family_tokenizer: Any) -> Tokenizer:
    return unnormalized(family_tokenizer)


@pytest.fixture(scope="session")
def client(llama_server: LlamaServer) -> OpenAI:
    return OpenAI(base_url=f"{llama_server.base_url}/v1", api_key="sk-none", max_retries=0)


def request_body(shape: Shape) -> dict[str, Any]:
    return {"model": "tiny", **shape.body, **SAMPLING}


def create(client: OpenAI, shape: Shape, **extra: Any) -> Any:
    body = {**request_body(shape), **extra}
    if shape.endpoint == "chat":
        return client.chat.completions.create(**body)
    return client.completions.create(**body)


def modelled_counts(tok: Any, raw: Tokenizer, shape: Shape) -> list[int]:
    """What llama-server should report per prompt (one entry for chat)."""
    body = request_body(shape)
    if shape.endpoint == "chat":
        return [llama_cpp_chat_count(tok, raw, body)]
    return llama_cpp_prompt_counts(raw, body)


def ids(shapes: list[Shape]) -> list[str]:
    return [s.name for s in shapes]


@pytest.mark.parametrize("shape", SHAPES, ids=ids(SHAPES))
def test_nonstream_prompt_tokens(
    client: OpenAI, family: str, family_tokenizer: Any, raw_tokenizer: Tokenizer, shape: Shape
) -> None:
    ours = count_request(family_tokenizer, shape.endpoint, request_body(shape))
    resp = create(client, shape)
    server = resp.usage.prompt_tokens
    modelled = modelled_counts(family_tokenizer, raw_tokenizer, shape)

    assert server == llama_cpp_nonstream_usage(modelled), "llama-server departs from the documented model"
    cause = shape.diverges.get(family)
    if cause is None:
        assert ours.expected_server == server, f"islwatch {ours.expected_server} != llama-server {server}"
    else:  # documented in docs/compatibility/llama-cpp.md#<cause>; if this starts matching, update the docs and the table
        assert ours.expected_server != server, f"documented divergence {cause} no longer happens"
    if cause == VLLM_REFUSES:  # the default (vLLM) flavor says vLLM answers 400; llama-server answered
        assert ours.fallback_reason == SERVER_REFUSES, ours
    if shape.endpoint == "completions":
        assert len(resp.choices) == len(ours.prompts)


@pytest.mark.parametrize("shape", SHAPES, ids=ids(SHAPES))
def test_stream_include_usage_prompt_tokens(
    client: OpenAI, family: str, family_tokenizer: Any, raw_tokenizer: Tokenizer, shape: Shape
) -> None:
    ours = count_request(family_tokenizer, shape.endpoint, request_body(shape))
    events = list(create(client, shape, stream=True, stream_options={"include_usage": True}))
    modelled = modelled_counts(family_tokenizer, raw_tokenizer, shape)
    reported = stream_usages(shape, events)

    assert reported == modelled, "llama-server's streamed usage departs from the documented model"
    cause = shape.diverges.get(family)
    # A list of prompts streams every prompt's own usage (docs/compatibility/llama-cpp.md#list-of-prompts-usage-...):
    # their sum is islwatch's count, but a usage parser that keeps only the latest usage sees the last one.
    if cause is None or cause == FIRST_PROMPT:
        assert sum(reported) == ours.expected_server
        assert reported == list(ours.prompts) or shape.endpoint == "chat"
    else:
        assert sum(reported) != ours.expected_server, f"documented divergence {cause} no longer happens"


def stream_usages(shape: Shape, events: list[Any]) -> list[int]:
    """Chat: one final chunk with choices [] carries usage. Completions: usage rides on each prompt's
    finish_reason chunk; between prompts llama-server sends `data: null` (openai yields None)."""
    real = [e for e in events if e is not None]
    if shape.endpoint == "chat":
        with_usage = [e for e in real if e.usage is not None]
        assert len(with_usage) == 1 and with_usage[0] is real[-1] and real[-1].choices == []
        assert all(e.usage is None for e in real[:-1])
        return [with_usage[0].usage.prompt_tokens]
    prompts = len(shape.body["prompt"]) if is_prompt_list(shape.body["prompt"]) else 1
    assert events.count(None) == prompts - 1
    by_index: dict[int, int] = {}
    for e in real:
        if e.usage is not None:
            (choice,) = e.choices
            assert choice.finish_reason is not None
            by_index[choice.index] = e.usage.prompt_tokens
    return [by_index[i] for i in sorted(by_index)]


def is_prompt_list(prompt: Any) -> bool:
    return isinstance(prompt, list) and bool(prompt) and not isinstance(prompt[0], int)


@pytest.mark.parametrize(
    "shape", [CHAT[0], CHAT[2], COMPLETIONS[0]], ids=ids([CHAT[0], CHAT[2], COMPLETIONS[0]])
)
def test_stream_without_include_usage(client: OpenAI, family_tokenizer: Any, shape: Shape) -> None:
    """Chat streams carry no usage unless asked (OpenAI semantics); /v1/completions streams always do."""
    events = [e for e in create(client, shape, stream=True) if e is not None]
    usages = [e.usage.prompt_tokens for e in events if e.usage is not None]
    if shape.endpoint == "chat":
        assert usages == []
        assert all(e.choices for e in events)
    else:
        ours = count_request(family_tokenizer, shape.endpoint, request_body(shape))
        assert usages == [ours.expected_server]
        assert events[-1].choices[0].finish_reason is not None


def test_list_of_prompts_stream_sends_data_null(llama_server: LlamaServer) -> None:
    """The raw bytes behind the None that openai yields: a `data: null` event between two prompts' streams."""
    req = urllib.request.Request(
        f"{llama_server.base_url}/v1/completions",
        data=b'{"prompt": ["a", "b"], "max_tokens": 1, "temperature": 0, "stream": true}',
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        events = [e for e in resp.read().decode().split("\n\n") if e]
    assert events.count("data: null") == 1
    assert events[-1] == "data: [DONE]"


def test_the_server_is_the_tested_version(llama_server: LlamaServer) -> None:
    """The llama.cpp flavor is pinned to the build tested (proxy.core.specs.TESTED_VERSIONS)."""
    from proxy.core.specs import TESTED_VERSIONS

    assert llama_server.version == TESTED_VERSIONS["llama.cpp"]
