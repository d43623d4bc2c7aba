"""`usage.prompt_tokens` on vLLM's path equals the tokenizer's own count: apply_chat_template(tokenize=True)
for chat-shaped requests, a plain encode (special tokens by default) for completions and embeddings."""

from __future__ import annotations

from typing import Any

import pytest

from tests.builders import build_tokenizer
from tests.conftest import FAMILIES, load_builtin, load_shared
from tests.emulator.emulator_helpers import (
    CHAT,
    CONVERSATIONS,
    FRANCE,
    THREE,
    direct_count,
    emulator,
    encode_len,
    post,
    responses_count,
    tokenizer_of,
    usage_with,
)

TEXT = "The quick brown fox"
PARTS = [{"type": "text", "text": "Hello"}, {"type": "text", "text": "world"}]


@pytest.mark.parametrize("conversation", list(CONVERSATIONS))
@pytest.mark.parametrize("family", ["builtin", *FAMILIES])
async def test_chat_usage_equals_direct_template_count(
    aiohttp_client: Any, family: str, conversation: str
) -> None:
    tok = tokenizer_of(family)
    body = CONVERSATIONS[conversation]
    try:
        expected: int | None = direct_count(tok, body["messages"], tools=body.get("tools"))
    except Exception:  # e.g. Mistral v0.1 refuses a system role: the server must refuse it too
        expected = None
    status, answer = await post(await emulator(aiohttp_client, tok), CHAT, {"model": "m", **body})
    if expected is None:
        assert status == 400
        assert answer["error"]["code"] == 400 and answer["error"]["message"]
    else:
        assert status == 200, answer
        assert answer["usage"]["prompt_tokens"] == expected


async def test_content_parts_template_gets_the_parts(aiohttp_client: Any) -> None:
    """A template that iterates content parts receives them as a list (vLLM's "openai" content format)."""
    tok = build_tokenizer("parts")
    client = await emulator(aiohttp_client, tok)
    _, answer = await post(client, CHAT, {"messages": [{"role": "user", "content": PARTS}]})
    assert answer["usage"]["prompt_tokens"] == direct_count(tok, [{"role": "user", "content": PARTS}])


async def test_string_template_gets_parts_joined(aiohttp_client: Any) -> None:
    tok = load_builtin().tokenizer
    client = await emulator(aiohttp_client, tok)
    _, answer = await post(client, CHAT, {"messages": [{"role": "user", "content": PARTS}]})
    assert answer["usage"]["prompt_tokens"] == direct_count(
        tok, [{"role": "user", "content": "Hello\nworld"}]
    )


async def test_continue_final_message(aiohttp_client: Any) -> None:
    tok = load_shared("qwen2.5-instruct").tokenizer
    prefill = [*FRANCE, {"role": "assistant", "content": "The capital is"}]
    body = {"messages": prefill, "continue_final_message": True, "add_generation_prompt": False}
    expected = direct_count(tok, prefill, add_generation_prompt=False, continue_final_message=True)
    assert await usage_with(aiohttp_client, tok, body=body) == expected


async def test_request_add_special_tokens_is_vllms_double_bos(aiohttp_client: Any) -> None:
    tok = load_shared("llama-3-8b-instruct").tokenizer
    body = {"messages": THREE, "add_special_tokens": True}
    assert await usage_with(aiohttp_client, tok, body=body) == direct_count(tok, THREE) + 1


async def test_responses_counts_like_chat(aiohttp_client: Any) -> None:
    tok = load_builtin().tokenizer
    client = await emulator(aiohttp_client, tok)
    _, answer = await post(client, "/v1/responses", {"input": FRANCE[0]["content"], "max_output_tokens": 5})
    assert answer["usage"]["input_tokens"] == responses_count(tok, FRANCE)
    assert answer["usage"]["output_tokens"] == 5
    assert encode_len(tok, answer["output"][0]["content"][0]["text"], False) == 5


# --- completions and embeddings: a plain encode, special tokens by default -----------------------------------


@pytest.fixture
def llama3() -> Any:
    return load_shared("llama-3-8b-instruct").tokenizer


async def test_completion_prompt_is_encoded_with_bos(aiohttp_client: Any, llama3: Any) -> None:
    client = await emulator(aiohttp_client, llama3)
    _, one = await post(client, "/v1/completions", {"prompt": TEXT, "max_tokens": 2})
    assert (
        one["usage"]["prompt_tokens"] == encode_len(llama3, TEXT, True) == encode_len(llama3, TEXT, False) + 1
    )


async def test_completion_prompts_text_and_ids(aiohttp_client: Any, llama3: Any) -> None:
    """Several prompts: each counted (token ids as given), each answered with max_tokens."""
    client = await emulator(aiohttp_client, llama3)
    _, many = await post(client, "/v1/completions", {"prompt": [TEXT, [5, 6, 7]], "max_tokens": 2})
    assert many["usage"]["prompt_tokens"] == encode_len(llama3, TEXT, True) + 3
    assert many["usage"]["completion_tokens"] == 4 and len(many["choices"]) == 2


async def test_completion_without_special_tokens(aiohttp_client: Any, llama3: Any) -> None:
    client = await emulator(aiohttp_client, llama3)
    _, plain = await post(client, "/v1/completions", {"prompt": TEXT, "add_special_tokens": False})
    assert plain["usage"]["prompt_tokens"] == encode_len(llama3, TEXT, False)


async def test_embeddings_inputs_are_encoded_with_bos(aiohttp_client: Any, llama3: Any) -> None:
    client = await emulator(aiohttp_client, llama3)
    _, emb = await post(client, "/v1/embeddings", {"input": [TEXT, "hi"]})
    assert emb["usage"] == {
        "prompt_tokens": encode_len(llama3, TEXT, True) + encode_len(llama3, "hi", True),
        "total_tokens": encode_len(llama3, TEXT, True) + encode_len(llama3, "hi", True),
        "completion_tokens": 0,
    }
    assert [d["index"] for d in emb["data"]] == [0, 1]


async def test_chat_style_embeddings_have_no_generation_prompt(aiohttp_client: Any, llama3: Any) -> None:
    """vLLM's chat-style embeddings: the template without a generation prompt unless asked for."""
    client = await emulator(aiohttp_client, llama3)
    _, chat_emb = await post(client, "/v1/embeddings", {"messages": FRANCE})
    assert chat_emb["usage"]["prompt_tokens"] == direct_count(llama3, FRANCE, add_generation_prompt=False)
