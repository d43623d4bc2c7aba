"""Each fault switch over HTTP: the count drifts by the expected amount, or requests fail as configured."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from proxy.emulator.counting import NO_TEMPLATE_JOIN
from tests.conftest import load_builtin, load_shared
from tests.emulator.emulator_helpers import (
    CHAT,
    FRANCE,
    THREE,
    direct_count,
    emulator,
    encode_len,
    post,
    sse_data,
    stats,
    tokenizer_of,
    usage_with,
)

# --- faults that change usage.prompt_tokens ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("family", "extra"), [("builtin", 1), ("llama-3-8b-instruct", 1), ("qwen2.5-instruct", 0)]
)
async def test_double_bos(aiohttp_client: Any, family: str, extra: int) -> None:
    tok = tokenizer_of(family)
    assert await usage_with(aiohttp_client, tok, "double-bos") == direct_count(tok, THREE) + extra


async def test_system_prompt(aiohttp_client: Any) -> None:
    tok = load_shared("qwen2.5-instruct").tokenizer
    assert await usage_with(aiohttp_client, tok, "system-prompt=7") == direct_count(tok, THREE) + 7


@pytest.mark.parametrize("family", ["builtin", "qwen2.5-instruct"])
async def test_no_template_joins_the_texts(aiohttp_client: Any, family: str) -> None:
    tok = tokenizer_of(family)
    joined = NO_TEMPLATE_JOIN.join(m["content"] for m in THREE)
    assert await usage_with(aiohttp_client, tok, "no-template") == encode_len(tok, joined, True)


@pytest.mark.parametrize("family", ["builtin", "qwen2.5-instruct"])
async def test_no_template_one_message_is_bare_text_plus_specials(aiohttp_client: Any, family: str) -> None:
    """One message: the server count is the bare text plus the plain special tokens (BOS where added)."""
    tok = tokenizer_of(family)
    one = await usage_with(aiohttp_client, tok, "no-template", body={"messages": FRANCE})
    special = encode_len(tok, "x", True) - encode_len(tok, "x", False)
    assert one == encode_len(tok, FRANCE[0]["content"], False) + special


async def test_gen_prompt_off(aiohttp_client: Any) -> None:
    tok = load_shared("qwen2.5-instruct").tokenizer
    off = direct_count(tok, THREE, add_generation_prompt=False)
    assert off < direct_count(tok, THREE)
    assert await usage_with(aiohttp_client, tok, "gen-prompt-off") == off


# --- faults that make requests fail or wait ------------------------------------------------------------------


async def test_status_fault_answers_vllms_error_body(aiohttp_client: Any) -> None:
    client = await emulator(aiohttp_client, load_builtin().tokenizer, "status=503@1")
    status, answer = await post(client, CHAT, {"messages": FRANCE})
    assert status == 503
    assert answer["error"] == {
        "message": "emulated fault: status 503",
        "type": "ServiceUnavailableError",
        "param": None,
        "code": 503,
    }


@pytest.mark.parametrize("path", ["/health", "/v1/models"])
async def test_status_fault_spares_non_inference_paths(aiohttp_client: Any, path: str) -> None:
    client = await emulator(aiohttp_client, load_builtin().tokenizer, "status=503@1")
    assert (await client.get(path)).status == 200  # only inference requests fail


async def test_status_fraction_is_seeded(aiohttp_client: Any) -> None:
    tok = load_builtin().tokenizer

    async def statuses(seed: int) -> list[int]:
        client = await emulator(aiohttp_client, tok, "status=503@0.5", seed=seed)
        out = []
        for _ in range(24):
            resp = await client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 1})
            out.append(resp.status)
        return out

    first, again = await statuses(3), await statuses(3)
    assert first == again
    assert set(first) == {200, 503}


async def cut_stream(client: Any) -> bytes:
    """What a client receives of a stream the reset fault cuts (the cut surfaces as ClientPayloadError)."""
    resp = await client.post(CHAT, json={"messages": FRANCE, "max_tokens": 8, "stream": True})
    assert resp.status == 200
    received = b""
    with pytest.raises(aiohttp.ClientPayloadError):
        async for chunk in resp.content.iter_any():
            received += chunk
    return received


async def test_reset_mid_stream_cuts_before_the_end(aiohttp_client: Any) -> None:
    client = await emulator(aiohttp_client, load_builtin().tokenizer, "reset-mid-stream@1")
    events = sse_data((await cut_stream(client)).decode())
    assert 0 < len(events) < 8 and "[DONE]" not in events
    counters = await stats(client)
    assert counters["streams_reset"] == 1 and counters["streams_completed"] == 0


async def test_reset_mid_stream_spares_the_next_json_answer(aiohttp_client: Any) -> None:
    """The emulator keeps serving, and a non-streaming request is not cut."""
    client = await emulator(aiohttp_client, load_builtin().tokenizer, "reset-mid-stream@1")
    await cut_stream(client)
    status, _ = await post(client, CHAT, {"messages": FRANCE})
    assert status == 200
    counters = await stats(client)
    assert counters["streams_reset"] == 1 and counters["streams_completed"] == 0


async def test_latency_delays_the_answer(aiohttp_client: Any) -> None:
    client = await emulator(aiohttp_client, load_builtin().tokenizer, "latency=60ms")
    loop = asyncio.get_running_loop()
    start = loop.time()
    status, _ = await post(client, CHAT, {"messages": FRANCE, "max_tokens": 1})
    assert status == 200
    assert loop.time() - start >= 0.05  # a lower bound only: the sleep is the behaviour under test
