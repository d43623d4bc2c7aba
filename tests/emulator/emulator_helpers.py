"""What the emulator tests share: conversations, the tokenizer's own counts, an app per fault set, SSE parsing."""

from __future__ import annotations

from typing import Any

import orjson

from proxy.emulator.app import EmulatorConfig, build_emulator_app
from proxy.emulator.faults import parse_faults
from tests.conftest import load_builtin, load_shared

CHAT = "/v1/chat/completions"
FRANCE = [{"role": "user", "content": "What is the capital of France?"}]
THREE = [
    {"role": "user", "content": "Hello! What is 2+2?"},
    {"role": "assistant", "content": "2+2 equals 4."},
    {"role": "user", "content": "Thanks. Now say it in French."},
]
SYSTEM = [{"role": "system", "content": "You are terse."}, *FRANCE]
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
CONVERSATIONS: dict[str, dict[str, Any]] = {
    "one": {"messages": FRANCE},
    "three": {"messages": THREE},
    "system": {"messages": SYSTEM},
    "tools": {"messages": FRANCE, "tools": [WEATHER_TOOL]},
}


def tokenizer_of(family: str) -> Any:
    return load_builtin().tokenizer if family == "builtin" else load_shared(family).tokenizer


def direct_count(tok: Any, messages: list[dict[str, Any]], **kwargs: Any) -> int:
    """The tokenizer's own count: apply_chat_template(tokenize=True), input_ids of the BatchEncoding."""
    encoded = tok.apply_chat_template(messages, tokenize=True, **{"add_generation_prompt": True, **kwargs})
    return len(encoded["input_ids"])


def responses_count(tok: Any, messages: list[dict[str, Any]]) -> int:
    """What vLLM 0.32 counts on /v1/responses: the rendered prompt encoded with special tokens (its
    ResponsesRequest keeps TokenizeParams.add_special_tokens=True; measured in tests/vllm)."""
    rendered = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return encode_len(tok, rendered, True)


def encode_len(tok: Any, text: str, special: bool) -> int:
    return len(tok(text, add_special_tokens=special)["input_ids"])


async def emulator(aiohttp_client: Any, tok: Any, *faults: str, **config: Any) -> Any:
    """A test client of an emulator app with these `--fault` specs, sharing the already loaded `tok`."""
    app = build_emulator_app(EmulatorConfig(faults=parse_faults(faults), **config), tokenizer=tok)
    return await aiohttp_client(app)


async def post(client: Any, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    resp = await client.post(path, json=body)
    return resp.status, orjson.loads(await resp.read())


async def usage_with(aiohttp_client: Any, tok: Any, *faults: str, body: dict[str, Any] | None = None) -> int:
    """prompt_tokens of one chat request (THREE by default) to an emulator with these faults."""
    client = await emulator(aiohttp_client, tok, *faults)
    _, answer = await post(client, CHAT, body or {"messages": THREE})
    return int(answer["usage"]["prompt_tokens"])


async def stats(client: Any) -> dict[str, Any]:
    return await (await client.get("/emulator/stats")).json()


def sse_data(text: str) -> list[Any]:
    """The `data:` payloads of an SSE body, `[DONE]` kept as a string."""
    out: list[Any] = []
    for event in text.split("\n\n"):
        for line in event.splitlines():
            if line.startswith("data: "):
                payload = line[len("data: ") :]
                out.append(payload if payload == "[DONE]" else orjson.loads(payload))
    return out
