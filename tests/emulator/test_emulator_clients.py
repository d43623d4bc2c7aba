"""The official openai client against the emulator: every endpoint parses, and the counts are vLLM's."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from openai import AsyncOpenAI

from proxy.emulator.app import EmulatorConfig, build_emulator_app
from tests.conftest import load_builtin
from tests.emulator.emulator_helpers import FRANCE, THREE, direct_count, encode_len, responses_count

HI = [{"role": "user", "content": "Hi"}]


@pytest.fixture
def tok() -> Any:
    return load_builtin().tokenizer


@pytest.fixture
async def client(aiohttp_server: Any, tok: Any) -> AsyncIterator[AsyncOpenAI]:
    server = await aiohttp_server(build_emulator_app(EmulatorConfig(models=("emu",)), tokenizer=tok))
    openai = AsyncOpenAI(base_url=str(server.make_url("/v1")), api_key="unused", max_retries=0)
    try:
        yield openai
    finally:
        await openai.close()


async def test_models(client: AsyncOpenAI) -> None:
    models = await client.models.list()
    assert [m.id for m in models.data] == ["emu"]


async def test_chat(client: AsyncOpenAI, tok: Any) -> None:
    chat = await client.chat.completions.create(model="emu", messages=FRANCE, max_tokens=3)  # type: ignore[arg-type]
    assert chat.usage is not None and chat.usage.prompt_tokens == direct_count(tok, FRANCE)
    assert chat.choices[0].message.content == "the the the"


async def test_chat_stream_with_usage(client: AsyncOpenAI, tok: Any) -> None:
    stream = await client.chat.completions.create(
        model="emu",
        messages=THREE,  # type: ignore[arg-type]
        max_tokens=2,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [c async for c in stream]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "the the"
    assert chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens == direct_count(tok, THREE)


async def test_completion(client: AsyncOpenAI) -> None:
    completion = await client.completions.create(model="emu", prompt="Hello", max_tokens=2)
    assert completion.usage is not None and completion.usage.completion_tokens == 2


async def test_embeddings_base64(client: AsyncOpenAI, tok: Any) -> None:
    emb = await client.embeddings.create(model="emu", input=["a", "b"])  # base64 on the wire by default
    assert len(emb.data) == 2 and len(emb.data[0].embedding) == 8
    assert emb.usage.prompt_tokens == 2 * encode_len(tok, "a", True)


async def test_responses(client: AsyncOpenAI, tok: Any) -> None:
    resp = await client.responses.create(model="emu", input="Hi", max_output_tokens=4)
    assert resp.output_text == "the the the the"
    assert resp.usage is not None and resp.usage.input_tokens == responses_count(tok, HI)


async def test_responses_stream(client: AsyncOpenAI, tok: Any) -> None:
    events = [e async for e in await client.responses.create(model="emu", input="Hi", stream=True)]
    assert events[-1].type == "response.completed"
    assert events[-1].response.usage is not None
    assert events[-1].response.usage.input_tokens == responses_count(tok, HI)
