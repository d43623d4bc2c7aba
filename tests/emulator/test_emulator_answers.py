"""The JSON answers: exactly `max_tokens` tokens of text, reproducible bytes, embeddings, and vLLM's refusals."""

from __future__ import annotations

import base64
import struct
from typing import Any

import pytest

from proxy.emulator.answers import embedding
from proxy.emulator.counting import NOT_TEXT
from tests.builders import build_tokenizer
from tests.conftest import load_builtin
from tests.emulator.emulator_helpers import CHAT, FRANCE, SYSTEM, emulator, encode_len, post, tokenizer_of


@pytest.mark.parametrize(
    ("extra", "n"), [({}, 16), ({"max_tokens": 5}, 5), ({"max_tokens": 5, "max_completion_tokens": 9}, 9)]
)
@pytest.mark.parametrize("family", ["builtin", "qwen2.5-instruct", "llama-3-8b-instruct"])
async def test_answer_is_exactly_max_tokens(
    aiohttp_client: Any, family: str, extra: dict[str, int], n: int
) -> None:
    tok = tokenizer_of(family)
    client = await emulator(aiohttp_client, tok)
    _, answer = await post(client, CHAT, {"messages": FRANCE, **extra})
    text = answer["choices"][0]["message"]["content"]
    assert encode_len(tok, text, False) == n == answer["usage"]["completion_tokens"]
    assert answer["usage"]["total_tokens"] == answer["usage"]["prompt_tokens"] + n


async def test_same_request_same_bytes(aiohttp_client: Any) -> None:
    client = await emulator(aiohttp_client, load_builtin().tokenizer)
    body = {"messages": FRANCE, "max_tokens": 4, "stream": True, "stream_options": {"include_usage": True}}
    first = await (await client.post(CHAT, json=body)).read()
    second = await (await client.post(CHAT, json=body)).read()
    assert first == second


def test_embedding_base64_is_float32() -> None:
    encoded = embedding(4, "base64")
    assert isinstance(encoded, str)
    assert struct.unpack("<4f", base64.b64decode(encoded)) == pytest.approx([0.5] * 4)


# --- refusals like vLLM's -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body", "status", "message"),
    [
        (CHAT, {"messages": SYSTEM}, 400, "roles must alternate"),
        (CHAT, {"messages": []}, 400, "messages"),
        (CHAT, {"messages": FRANCE, "continue_final_message": True}, 400, "Cannot set both"),
        (CHAT, {"messages": FRANCE, "max_tokens": 0}, 400, "at least 1"),
        (CHAT, {"messages": FRANCE, "n": 2}, 400, "n=1"),
        (CHAT, {"model": "other", "messages": FRANCE}, 404, "does not exist"),
        ("/v1/completions", {"prompt": 3}, 400, "prompt"),
    ],
)
async def test_refusals(
    aiohttp_client: Any, path: str, body: dict[str, Any], status: int, message: str
) -> None:
    client = await emulator(aiohttp_client, load_builtin().tokenizer, models=("m",), strict_models=True)
    got, answer = await post(client, path, body)
    assert got == status
    assert message in answer["error"]["message"] and answer["error"]["code"] == status


async def test_invalid_json_is_400(aiohttp_client: Any) -> None:
    client = await emulator(aiohttp_client, load_builtin().tokenizer)
    resp = await client.post(CHAT, data=b"{not json", headers={"Content-Type": "text/plain"})
    assert resp.status == 400
    assert (await resp.json())["error"]["type"] == "BadRequestError"


class RendersIds:
    """A tokenizer whose template renders to token ids instead of text (encodes like the one it wraps)."""

    def __init__(self, tok: Any) -> None:
        self.tok = tok
        self.chat_template = tok.chat_template

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.tok(*args, **kwargs)

    def apply_chat_template(self, *args: Any, **kwargs: Any) -> list[int]:
        return [1, 2, 3]


async def test_template_not_rendering_text_is_400(aiohttp_client: Any) -> None:
    client = await emulator(aiohttp_client, RendersIds(build_tokenizer("chatml")))
    status, answer = await post(client, CHAT, {"messages": FRANCE})
    assert status == 400
    assert answer["error"]["message"] == NOT_TEXT
