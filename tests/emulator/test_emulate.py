"""`islwatch emulate` against real tokenizers, real aiohttp servers and real clients (aiohttp, openai)."""

from __future__ import annotations

import asyncio
import base64
import os
import signal
import struct
import subprocess
import sys
from typing import Any

import aiohttp
import orjson
import pytest
from builders import build_tokenizer
from conftest import FAMILIES, REPO, load_builtin, load_shared

from proxy.cli import main as cli_main
from proxy.emulator.app import NO_TEMPLATE_JOIN, EmulatorConfig, build_emulator_app
from proxy.emulator.faults import Faults, parse_duration, parse_faults

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


def encode_len(tok: Any, text: str, special: bool) -> int:
    return len(tok(text, add_special_tokens=special)["input_ids"])


async def emulator(aiohttp_client: Any, tok: Any, *faults: str, **config: Any) -> Any:
    app = build_emulator_app(EmulatorConfig(faults=parse_faults(faults), **config), tokenizer=tok)
    return await aiohttp_client(app)


async def post(client: Any, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    resp = await client.post(path, json=body)
    return resp.status, orjson.loads(await resp.read())


def sse_data(text: str) -> list[Any]:
    """The `data:` payloads of an SSE body, `[DONE]` kept as a string."""
    out: list[Any] = []
    for event in text.split("\n\n"):
        for line in event.splitlines():
            if line.startswith("data: "):
                payload = line[len("data: ") :]
                out.append(payload if payload == "[DONE]" else orjson.loads(payload))
    return out


# --- fault spec parsing (pure) ------------------------------------------------------------------------------


def test_fault_specs_parse() -> None:
    faults = parse_faults(
        [
            "double-bos",
            "no-template",
            "system-prompt=7",
            "gen-prompt-off",
            "status=503@0.1",
            "latency=50ms",
            "token-latency=0.002s",
            "reset-mid-stream@0.25",
        ]
    )
    assert faults == Faults(
        double_bos=True,
        no_template=True,
        system_prompt_tokens=7,
        gen_prompt_off=True,
        status=503,
        status_rate=0.1,
        latency_seconds=0.05,
        token_latency_seconds=0.002,
        reset_rate=0.25,
    )
    assert parse_faults(["status=429"]).status_rate == 1.0
    assert parse_faults(["reset-mid-stream"]).reset_rate == 1.0
    assert parse_faults([]) == Faults() and not Faults().changes_count
    assert parse_duration("1.5") == 1.5
    assert parse_faults(faults.describe()) == faults  # describe() round-trips


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("bogus", "unknown fault"),
        ("system-prompt=x", "system-prompt=N"),
        ("system-prompt", "system-prompt=N"),
        ("double-bos=1", "plain"),
        ("status=200@0.1", "between 400 and 599"),
        ("status=503@1.5", "between 0 and 1"),
        ("status=503@nan", "between 0 and 1"),
        ("latency=fast", "bad duration"),
        ("latency=5h", "bad duration"),
        ("latency=9999s", "above"),
        ("reset-mid-stream=3", "reset-mid-stream[@FRACTION]"),
    ],
)
def test_bad_fault_specs_are_clear_errors(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[")):
        parse_faults([spec])


def test_repeated_fault_is_an_error() -> None:
    with pytest.raises(ValueError, match="more than once"):
        parse_faults(["latency=1ms", "latency=2ms"])


def test_cli_bad_fault_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["emulate", "--fault", "status=999"]) == 2
    assert "between 400 and 599" in capsys.readouterr().err


def test_cli_bad_listen_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["emulate", "--listen", "localhost"]) == 2
    assert "HOST:PORT" in capsys.readouterr().err


# --- prompt_tokens equals the tokenizer's own apply_chat_template(tokenize=True) ----------------------------


@pytest.mark.parametrize("family", ["builtin", *FAMILIES])
async def test_chat_usage_equals_direct_template_count(aiohttp_client: Any, family: str) -> None:
    tok = tokenizer_of(family)
    client = await emulator(aiohttp_client, tok)
    for name, body in CONVERSATIONS.items():
        try:
            expected: int | None = direct_count(tok, body["messages"], tools=body.get("tools"))
        except Exception:  # e.g. Mistral v0.1 refuses a system role: the server must refuse it too
            expected = None
        status, answer = await post(client, "/v1/chat/completions", {"model": "m", **body})
        if expected is None:
            assert status == 400, name
            assert answer["error"]["code"] == 400 and answer["error"]["message"]
        else:
            assert status == 200, (name, answer)
            assert answer["usage"]["prompt_tokens"] == expected, name


async def test_content_parts_template_gets_the_parts(aiohttp_client: Any) -> None:
    """A template that iterates content parts receives them as a list (vLLM's "openai" content format)."""
    tok = build_tokenizer("parts")
    client = await emulator(aiohttp_client, tok)
    parts = [{"type": "text", "text": "Hello"}, {"type": "text", "text": "world"}]
    _, answer = await post(client, "/v1/chat/completions", {"messages": [{"role": "user", "content": parts}]})
    assert answer["usage"]["prompt_tokens"] == direct_count(tok, [{"role": "user", "content": parts}])


async def test_string_template_gets_parts_joined(aiohttp_client: Any) -> None:
    tok = load_builtin().tokenizer
    client = await emulator(aiohttp_client, tok)
    parts = [{"type": "text", "text": "Hello"}, {"type": "text", "text": "world"}]
    _, answer = await post(client, "/v1/chat/completions", {"messages": [{"role": "user", "content": parts}]})
    assert answer["usage"]["prompt_tokens"] == direct_count(
        tok, [{"role": "user", "content": "Hello\nworld"}]
    )


async def test_completions_and_embeddings_count_plain_encode(aiohttp_client: Any) -> None:
    tok = load_shared("llama-3-8b-instruct").tokenizer
    client = await emulator(aiohttp_client, tok)
    text = "The quick brown fox"
    _, one = await post(client, "/v1/completions", {"prompt": text, "max_tokens": 2})
    assert one["usage"]["prompt_tokens"] == encode_len(tok, text, True) == encode_len(tok, text, False) + 1
    _, many = await post(client, "/v1/completions", {"prompt": [text, [5, 6, 7]], "max_tokens": 2})
    assert many["usage"]["prompt_tokens"] == encode_len(tok, text, True) + 3
    assert many["usage"]["completion_tokens"] == 4 and len(many["choices"]) == 2
    _, plain = await post(client, "/v1/completions", {"prompt": text, "add_special_tokens": False})
    assert plain["usage"]["prompt_tokens"] == encode_len(tok, text, False)
    _, emb = await post(client, "/v1/embeddings", {"input": [text, "hi"]})
    assert emb["usage"] == {
        "prompt_tokens": encode_len(tok, text, True) + encode_len(tok, "hi", True),
        "total_tokens": encode_len(tok, text, True) + encode_len(tok, "hi", True),
        "completion_tokens": 0,
    }
    assert [d["index"] for d in emb["data"]] == [0, 1]
    # vLLM's chat-style embeddings: the template without a generation prompt unless asked for.
    _, chat_emb = await post(client, "/v1/embeddings", {"messages": FRANCE})
    assert chat_emb["usage"]["prompt_tokens"] == direct_count(tok, FRANCE, add_generation_prompt=False)


async def test_responses_counts_like_chat(aiohttp_client: Any) -> None:
    tok = load_builtin().tokenizer
    client = await emulator(aiohttp_client, tok)
    _, answer = await post(client, "/v1/responses", {"input": FRANCE[0]["content"], "max_output_tokens": 5})
    assert answer["usage"]["input_tokens"] == direct_count(tok, FRANCE)
    assert answer["usage"]["output_tokens"] == 5
    assert encode_len(tok, answer["output"][0]["content"][0]["text"], False) == 5


# --- deterministic answer text ------------------------------------------------------------------------------


@pytest.mark.parametrize("family", ["builtin", "qwen2.5-instruct", "llama-3-8b-instruct"])
async def test_answer_is_exactly_max_tokens(aiohttp_client: Any, family: str) -> None:
    tok = tokenizer_of(family)
    client = await emulator(aiohttp_client, tok)
    for extra, n in [({}, 16), ({"max_tokens": 5}, 5), ({"max_tokens": 5, "max_completion_tokens": 9}, 9)]:
        _, answer = await post(client, "/v1/chat/completions", {"messages": FRANCE, **extra})
        text = answer["choices"][0]["message"]["content"]
        assert encode_len(tok, text, False) == n == answer["usage"]["completion_tokens"]
        assert answer["usage"]["total_tokens"] == answer["usage"]["prompt_tokens"] + n


async def test_same_request_same_bytes(aiohttp_client: Any) -> None:
    client = await emulator(aiohttp_client, load_builtin().tokenizer)
    body = {"messages": FRANCE, "max_tokens": 4, "stream": True, "stream_options": {"include_usage": True}}
    first = await (await client.post("/v1/chat/completions", json=body)).read()
    second = await (await client.post("/v1/chat/completions", json=body)).read()
    assert first == second


# --- streaming ----------------------------------------------------------------------------------------------


async def test_chat_stream_without_usage(aiohttp_client: Any) -> None:
    client = await emulator(aiohttp_client, load_builtin().tokenizer)
    resp = await client.post(
        "/v1/chat/completions", json={"messages": FRANCE, "max_tokens": 4, "stream": True}
    )
    assert resp.headers["Content-Type"].startswith("text/event-stream")
    raw = await resp.text()
    assert "usage" not in raw
    events = sse_data(raw)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * 5 + ["length"]
    streamed = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    _, full = await post(client, "/v1/chat/completions", {"messages": FRANCE, "max_tokens": 4})
    assert streamed == full["choices"][0]["message"]["content"]


async def test_chat_stream_with_usage(aiohttp_client: Any) -> None:
    tok = load_builtin().tokenizer
    client = await emulator(aiohttp_client, tok)
    body = {"messages": THREE, "max_tokens": 3, "stream": True, "stream_options": {"include_usage": True}}
    events = sse_data(await (await client.post("/v1/chat/completions", json=body)).text())
    assert events[-1] == "[DONE]"
    last = events[-2]
    assert last["choices"] == []
    assert last["usage"] == {
        "prompt_tokens": direct_count(tok, THREE),
        "total_tokens": direct_count(tok, THREE) + 3,
        "completion_tokens": 3,
    }
    assert all("usage" not in e for e in events[:-2])
    # vLLM's continuous_usage_stats: usage on every chunk, completion tokens so far.
    body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    events = sse_data(await (await client.post("/v1/chat/completions", json=body)).text())
    assert [e["usage"]["completion_tokens"] for e in events[:-1]] == [0, 1, 2, 3, 3, 3]


async def test_completions_stream(aiohttp_client: Any) -> None:
    tok = load_builtin().tokenizer
    client = await emulator(aiohttp_client, tok)
    body = {"prompt": "Once upon", "max_tokens": 2, "stream": True, "stream_options": {"include_usage": True}}
    events = sse_data(await (await client.post("/v1/completions", json=body)).text())
    assert "".join(e["choices"][0]["text"] for e in events[:-2]) == "the the"
    assert events[-2]["usage"]["prompt_tokens"] == encode_len(tok, "Once upon", True)


async def test_responses_stream_completed_carries_usage(aiohttp_client: Any) -> None:
    tok = load_builtin().tokenizer
    client = await emulator(aiohttp_client, tok)
    raw = await (await client.post("/v1/responses", json={"input": "Hi there", "stream": True})).text()
    events = sse_data(raw)
    assert events[0]["type"] == "response.created" and events[-1]["type"] == "response.completed"
    assert "event: response.completed\n" in raw
    deltas = [e["delta"] for e in events if e["type"] == "response.output_text.delta"]
    assert len(deltas) == 16
    usage = events[-1]["response"]["usage"]
    assert usage["input_tokens"] == direct_count(tok, [{"role": "user", "content": "Hi there"}])
    assert usage["output_tokens"] == 16
    assert [e["sequence_number"] for e in events] == list(range(len(events)))


async def test_stream_chunks_are_flushed_one_by_one(aiohttp_client: Any) -> None:
    """With a gap between chunks the first chunk arrives while the emulator is still writing the rest."""
    client = await emulator(aiohttp_client, load_builtin().tokenizer, "token-latency=50ms")
    resp = await client.post(
        "/v1/chat/completions", json={"messages": FRANCE, "max_tokens": 20, "stream": True}
    )
    first = await resp.content.readuntil(b"\n\n")
    assert b'"role":"assistant"' in first
    stats = await (await client.get("/emulator/stats")).json()
    assert stats["streams_started"] == 1 and stats["streams_completed"] == 0
    rest = await resp.read()
    assert rest.endswith(b"data: [DONE]\n\n")


# --- faults change usage by the expected amount -------------------------------------------------------------


async def usage_with(aiohttp_client: Any, tok: Any, *faults: str, body: dict[str, Any] | None = None) -> int:
    client = await emulator(aiohttp_client, tok, *faults)
    _, answer = await post(client, "/v1/chat/completions", body or {"messages": THREE})
    return int(answer["usage"]["prompt_tokens"])


@pytest.mark.parametrize(
    ("family", "extra"), [("builtin", 1), ("llama-3-8b-instruct", 1), ("qwen2.5-instruct", 0)]
)
async def test_double_bos(aiohttp_client: Any, family: str, extra: int) -> None:
    tok = tokenizer_of(family)
    assert await usage_with(aiohttp_client, tok, "double-bos") == direct_count(tok, THREE) + extra


async def test_request_add_special_tokens_is_vllms_double_bos(aiohttp_client: Any) -> None:
    tok = load_shared("llama-3-8b-instruct").tokenizer
    body = {"messages": THREE, "add_special_tokens": True}
    assert await usage_with(aiohttp_client, tok, body=body) == direct_count(tok, THREE) + 1


async def test_system_prompt(aiohttp_client: Any) -> None:
    tok = load_shared("qwen2.5-instruct").tokenizer
    assert await usage_with(aiohttp_client, tok, "system-prompt=7") == direct_count(tok, THREE) + 7


@pytest.mark.parametrize("family", ["builtin", "qwen2.5-instruct"])
async def test_no_template(aiohttp_client: Any, family: str) -> None:
    tok = tokenizer_of(family)
    joined = NO_TEMPLATE_JOIN.join(m["content"] for m in THREE)
    assert await usage_with(aiohttp_client, tok, "no-template") == encode_len(tok, joined, True)
    # One message: the server count is the bare text plus the plain special tokens (BOS where added).
    one = await usage_with(aiohttp_client, tok, "no-template", body={"messages": FRANCE})
    special = encode_len(tok, "x", True) - encode_len(tok, "x", False)
    assert one == encode_len(tok, FRANCE[0]["content"], False) + special


async def test_gen_prompt_off(aiohttp_client: Any) -> None:
    tok = load_shared("qwen2.5-instruct").tokenizer
    off = direct_count(tok, THREE, add_generation_prompt=False)
    assert off < direct_count(tok, THREE)
    assert await usage_with(aiohttp_client, tok, "gen-prompt-off") == off


async def test_status_fault(aiohttp_client: Any) -> None:
    client = await emulator(aiohttp_client, load_builtin().tokenizer, "status=503@1")
    status, answer = await post(client, "/v1/chat/completions", {"messages": FRANCE})
    assert status == 503
    assert answer["error"] == {
        "message": "emulated fault: status 503",
        "type": "ServiceUnavailableError",
        "param": None,
        "code": 503,
    }
    assert (await client.get("/health")).status == 200  # only inference requests fail
    assert (await client.get("/v1/models")).status == 200


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


async def test_reset_mid_stream(aiohttp_client: Any) -> None:
    client = await emulator(aiohttp_client, load_builtin().tokenizer, "reset-mid-stream@1")
    resp = await client.post(
        "/v1/chat/completions", json={"messages": FRANCE, "max_tokens": 8, "stream": True}
    )
    assert resp.status == 200
    received = b""
    with pytest.raises(aiohttp.ClientPayloadError):
        async for chunk in resp.content.iter_any():
            received += chunk
    events = sse_data(received.decode())
    assert 0 < len(events) < 8 and "[DONE]" not in events
    # The emulator keeps serving, and a non-streaming request is not cut.
    status, _ = await post(client, "/v1/chat/completions", {"messages": FRANCE})
    assert status == 200
    stats = await (await client.get("/emulator/stats")).json()
    assert stats["streams_reset"] == 1 and stats["streams_completed"] == 0


async def test_latency_delays_the_answer(aiohttp_client: Any) -> None:
    client = await emulator(aiohttp_client, load_builtin().tokenizer, "latency=60ms")
    loop = asyncio.get_running_loop()
    start = loop.time()
    status, _ = await post(client, "/v1/chat/completions", {"messages": FRANCE, "max_tokens": 1})
    assert status == 200
    assert loop.time() - start >= 0.05  # a lower bound only: the sleep is the behaviour under test


# --- refusals like vLLM's -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body", "status", "message"),
    [
        ("/v1/chat/completions", {"messages": SYSTEM}, 400, "roles must alternate"),
        ("/v1/chat/completions", {"messages": []}, 400, "messages"),
        (
            "/v1/chat/completions",
            {"messages": FRANCE, "continue_final_message": True},
            400,
            "Cannot set both",
        ),
        ("/v1/chat/completions", {"messages": FRANCE, "max_tokens": 0}, 400, "at least 1"),
        ("/v1/chat/completions", {"messages": FRANCE, "n": 2}, 400, "n=1"),
        ("/v1/chat/completions", {"model": "other", "messages": FRANCE}, 404, "does not exist"),
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
    resp = await client.post(
        "/v1/chat/completions", data=b"{not json", headers={"Content-Type": "text/plain"}
    )
    assert resp.status == 400
    assert (await resp.json())["error"]["type"] == "BadRequestError"


async def test_continue_final_message(aiohttp_client: Any) -> None:
    tok = load_shared("qwen2.5-instruct").tokenizer
    prefill = [*FRANCE, {"role": "assistant", "content": "The capital is"}]
    body = {"messages": prefill, "continue_final_message": True, "add_generation_prompt": False}
    expected = direct_count(tok, prefill, add_generation_prompt=False, continue_final_message=True)
    assert await usage_with(aiohttp_client, tok, body=body) == expected


# --- real clients -------------------------------------------------------------------------------------------


async def test_openai_client(aiohttp_server: Any) -> None:
    from openai import AsyncOpenAI

    tok = load_builtin().tokenizer
    server = await aiohttp_server(build_emulator_app(EmulatorConfig(models=("emu",)), tokenizer=tok))
    client = AsyncOpenAI(base_url=str(server.make_url("/v1")), api_key="unused", max_retries=0)
    try:
        models = await client.models.list()
        assert [m.id for m in models.data] == ["emu"]

        chat = await client.chat.completions.create(model="emu", messages=FRANCE, max_tokens=3)  # type: ignore[arg-type]
        assert chat.usage is not None and chat.usage.prompt_tokens == direct_count(tok, FRANCE)
        assert chat.choices[0].message.content == "the the the"

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

        completion = await client.completions.create(model="emu", prompt="Hello", max_tokens=2)
        assert completion.usage is not None and completion.usage.completion_tokens == 2

        emb = await client.embeddings.create(model="emu", input=["a", "b"])  # base64 on the wire by default
        assert len(emb.data) == 2 and len(emb.data[0].embedding) == 8
        assert emb.usage.prompt_tokens == 2 * encode_len(tok, "a", True)

        resp = await client.responses.create(model="emu", input="Hi", max_output_tokens=4)
        assert resp.output_text == "the the the the"
        assert resp.usage is not None and resp.usage.input_tokens == direct_count(
            tok, [{"role": "user", "content": "Hi"}]
        )

        events = [e async for e in await client.responses.create(model="emu", input="Hi", stream=True)]
        assert events[-1].type == "response.completed"
        assert events[-1].response.usage is not None
        assert events[-1].response.usage.input_tokens == resp.usage.input_tokens
    finally:
        await client.close()


def test_embedding_base64_is_float32() -> None:
    from proxy.emulator.app import _embedding

    encoded = _embedding(4, "base64")
    assert isinstance(encoded, str)
    assert struct.unpack("<4f", base64.b64decode(encoded)) == pytest.approx([0.5] * 4)


def test_cli_serves_and_stops_on_sigterm() -> None:
    """`islwatch emulate` as a process: ready line with the bound port, a real request, clean exit."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "proxy.cli",
            "emulate",
            "--listen",
            "127.0.0.1:0",
            "--model",
            "m",
            "--fault",
            "system-prompt=3",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("islwatch emulate: listening on http://127.0.0.1:"), line
        url = line.rsplit(" ", 1)[1].strip()
        body = orjson.dumps({"model": "m", "messages": FRANCE})
        out = subprocess.run(
            [
                "curl",
                "-sS",
                "-H",
                "Content-Type: application/json",
                "--data-binary",
                "@-",
                url + "/v1/chat/completions",
            ],
            input=body,
            capture_output=True,
            check=True,
            timeout=30,
        )
        usage = orjson.loads(out.stdout)["usage"]
        assert usage["prompt_tokens"] == direct_count(load_builtin().tokenizer, FRANCE) + 3
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
