"""`--endpoint messages`: Anthropic Messages bodies (top-level `system`, `tool_use` / `tool_result` blocks,
`max_tokens`), each budgeted through the served model's count of the Messages body (the server's conversion
into a chat request, then that chat's count), so the prompt the server reports (input_tokens plus the cache
reads the Messages API leaves out of it) equals the target: plain multi-turn conversations and the agent
workload, per round, JSON and streamed, against the emulator (with its prefix cache on and off) and through
the proxy. The emulator counts with its own vLLM counting (proxy/emulator/counting.py), which shares the
conversion but not the chat counting with the budget's path."""

from __future__ import annotations

import asyncio
import itertools
from functools import cache
from pathlib import Path
from typing import Any

import orjson
import pytest

from loadgen.config import LoadgenConfig
from loadgen.send import proxy_metrics
from loadgen.send.replies import StreamTimer, json_outcome
from loadgen.send.runner import Engine, Record, session_headers
from loadgen.workload.agent import AgentWorkload, Shape, conversation_requests, tool_schemas
from loadgen.workload.anthropic import anthropic_tools, as_messages, history_of
from loadgen.workload.conversations import Request, Workload
from loadgen.workload.sources import build_workload
from proxy.core.endpoints import Endpoint
from proxy.core.model import ServedModel, load_served_model
from proxy.emulator.app import EmulatorConfig, start_emulator
from proxy.emulator.counting import anthropic_as_chat, chat_prompt_tokens
from proxy.emulator.faults import Faults
from tests.conftest import shared_dir
from tests.eventually import eventually_async
from tests.lanes import sweep

ISL, TURNS, SYSTEM = 200, 3, 40  # conversations: ISL per user turn, a shared system prompt of 40 tokens
AGENT_ISL, ROUND, ROUNDS = 900, 150, 3


@cache
def served(family: str) -> ServedModel:
    return load_served_model(str(shared_dir(family)))


def config(family: str, url: str = "http://x", **kw: Any) -> LoadgenConfig:
    base: dict[str, Any] = {"url": url, "endpoint": "messages", "tokenizer": str(shared_dir(family)), "osl": 5,
                            "concurrency": 2, "run_id": "messages"}  # fmt: skip
    return LoadgenConfig(**{**base, **kw})


def conversation_config(family: str, url: str = "http://x", **kw: Any) -> LoadgenConfig:
    return config(family, url, isl=ISL, turns=TURNS, shared_system_prompt_length=SYSTEM,
                  cache_bust="system_suffix", request_count=2 * TURNS, **kw)  # fmt: skip


def agent_config(family: str, url: str = "http://x", **kw: Any) -> LoadgenConfig:
    return config(family, url, workload="agent", isl=AGENT_ISL, round_isl=ROUND, agent_rounds=ROUNDS, tools=3,
                  parallel_calls=3, cache_bust="first_turn_prefix", request_count=2 * (ROUNDS + 1), **kw)  # fmt: skip


def emulator_count(family: str, body: dict[str, Any]) -> int:
    """The emulator's own count of a Messages body: vLLM's conversion, then its vLLM chat counting."""
    tok = served(family).tokenizer
    return chat_prompt_tokens(tok, Endpoint.CHAT, anthropic_as_chat(tok, Endpoint.MESSAGES, body), Faults())


async def run(family: str, cfg: LoadgenConfig, prefix_cache: bool) -> tuple[LoadgenConfig, list[Record]]:
    model = served(family)
    emulator = EmulatorConfig(tokenizer=cfg.tokenizer, prefix_cache=prefix_cache)
    runner, url = await start_emulator(emulator, tokenizer=model.tokenizer)
    try:
        cfg, workload = build_workload(model.tokenizer, cfg.model_copy(update={"url": url}))
        return cfg, await Engine(cfg, workload).run()
    finally:
        await runner.cleanup()


def assert_exact(records: list[Record], n: int) -> None:
    assert len(records) == n
    for r in records:
        assert r.error is None and r.budget_error is None, r
        assert r.server_prompt_tokens == r.client_isl == r.target_isl, r


def by_conversation(records: list[Record]) -> list[list[Record]]:
    ordered = sorted(records, key=lambda r: (r.conversation, r.turn))
    return [list(turns) for _, turns in itertools.groupby(ordered, key=lambda r: r.conversation)]


# --- the bodies ---------------------------------------------------------------------------------------------
def test_a_conversation_is_a_messages_request() -> None:
    """System prompt (with its marker) top-level, user/assistant turns, max_tokens and stream; each turn's
    body extends the one before; the served model's count of the wire body is the target."""
    cfg = conversation_config("qwen3", streaming=True, osl=7)
    _, w = build_workload(served("qwen3").tokenizer, cfg)
    conv, first = w.start("c0")
    reqs = [first, w.follow_up(conv, "Sure, here is the plan."), w.follow_up(conv, "Done.")]
    body = reqs[-1].body
    assert set(body) == {"model", "system", "messages", "max_tokens", "stream"}
    assert body["max_tokens"] == 7 and body["stream"] is True and "ignore_eos" not in body
    assert first.marker and body["system"].endswith(first.marker)
    assert [m["role"] for m in body["messages"]] == ["user", "assistant", "user", "assistant", "user"]
    assert body["messages"][1] == {"role": "assistant", "content": "Sure, here is the plan."}
    assert cfg.endpoint_url == "http://x/v1/messages"
    for prev, cur in itertools.pairwise(reqs):
        assert cur.body["system"] == prev.body["system"]
        assert cur.body["messages"][: len(prev.body["messages"])] == prev.body["messages"]
        assert cur.target_isl == prev.target_isl + cur.reply_tokens + ISL and cur.reply_tokens > 0
    for r in reqs:
        assert r.error is None and r.client_isl == r.target_isl, r
        assert served("qwen3").count("messages", orjson.loads(r.wire)).expected_server == r.target_isl
        assert emulator_count("qwen3", r.body) == r.target_isl


def test_an_agent_round_is_tool_use_and_tool_result_blocks() -> None:
    """Reasoning as a thinking block, calls as tool_use blocks (input: the arguments object), the results as
    tool_result blocks in one user message, the tools as Anthropic tools; every round at its target."""
    cfg = agent_config("qwen3", shared_system_prompt_length=SYSTEM)
    w = build_workload(served("qwen3").tokenizer, cfg)[1]
    assert isinstance(w, AgentWorkload) and w.shape is Shape.NATIVE and w.max_calls == 3
    reqs = conversation_requests(w, "c0")
    assert [r.target_isl for r in reqs] == [AGENT_ISL + k * ROUND for k in range(ROUNDS + 1)]
    for r in reqs:
        assert r.error is None and r.client_isl == r.target_isl, r
        assert emulator_count("qwen3", r.body) == r.target_isl
        assert orjson.loads(r.wire) == r.body and "system" in r.body
        assert r.body["tools"] == anthropic_tools(tool_schemas(3))
        assert all(set(t) == {"name", "description", "input_schema"} for t in r.body["tools"])
    for prev, cur in itertools.pairwise(reqs):  # the agent's long shared prefix
        assert cur.body["messages"][: len(prev.body["messages"])] == prev.body["messages"]
    messages = reqs[-1].body["messages"]
    assert [m["role"] for m in messages] == ["user"] + ["assistant", "user"] * ROUNDS
    for assistant, results in zip(messages[1::2], messages[2::2], strict=True):
        kinds = [b["type"] for b in assistant["content"]]
        assert kinds[0] == "thinking" and set(kinds[1:]) == {"tool_use"}
        uses = [b for b in assistant["content"] if b["type"] == "tool_use"]
        assert all(isinstance(b["input"], dict) and b["input"] for b in uses)
        assert [b["type"] for b in results["content"]] == ["tool_result"] * len(uses)
        assert [b["tool_use_id"] for b in results["content"]] == [b["id"] for b in uses]
    assert max(len(m["content"]) for m in messages[1::2]) > 2  # parallel calls in one turn
    # Qwen3 keeps reasoning after the last user turn: the thinking blocks are in the count.
    bare = {**reqs[-1].body, "messages": [
        {**m, "content": [b for b in m["content"] if b["type"] != "thinking"]} if m["role"] == "assistant" else m
        for m in messages
    ]}  # fmt: skip
    dropped = served("qwen3").count("messages", bare).expected_server
    assert dropped is not None and dropped < reqs[-1].target_isl


def test_the_conversion_is_idempotent_on_a_sent_history() -> None:
    """A history kept as sent rewrites to itself (the next request extends it byte for byte)."""
    chat = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "Q"},
        {"role": "assistant", "content": None, "reasoning_content": "R",
         "tool_calls": [{"id": "a", "type": "function", "function": {"name": "f", "arguments": '{"x":1}'}},
                        {"id": "b", "type": "function", "function": {"name": "g", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "a", "content": "ra"},
        {"role": "tool", "tool_call_id": "b", "content": "rb"},
        {"role": "assistant", "content": "done"},
    ]  # fmt: skip
    system, messages = as_messages(chat)
    assert system == "S" and [m["role"] for m in messages] == ["user", "assistant", "user", "assistant"]
    assert messages[1]["content"][1] == {"type": "tool_use", "id": "a", "name": "f", "input": {"x": 1}}
    assert [b["content"] for b in messages[2]["content"]] == ["ra", "rb"]
    again = history_of({"system": system, "messages": messages})
    assert as_messages(again) == (system, messages)
    with pytest.raises(ValueError, match="one top-level system"):
        as_messages([{"role": "user", "content": "Q"}, {"role": "system", "content": "S"}])


@pytest.mark.parametrize(
    "kw, problem",
    [
        ({"ignore_eos": True}, "--ignore-eos does not apply to --endpoint messages"),
        ({"images": 1}, "--images needs --endpoint chat"),
        (
            {"workload": "agent", "round_isl": 10, "endpoint": "completions"},
            "needs --endpoint chat or messages",
        ),
    ],
)
def test_contradictions(kw: dict[str, Any], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        config("qwen3", **{"isl": 100, "request_count": 2, **kw})


def test_content_parts_and_anthropic_headers() -> None:
    cfg = config("qwen3", isl=100, request_count=2, content_parts=True, api_key="k",
                 cache_bust="first_turn_prefix")  # fmt: skip
    req = build_workload(served("qwen3").tokenizer, cfg)[1].start("c0")[1]
    assert req.error is None and req.client_isl == 100
    parts = req.body["messages"][0]["content"]
    assert [p["type"] for p in parts] == ["text", "text"] and req.marker in parts[0]["text"]
    assert emulator_count("qwen3", req.body) == 100
    assert session_headers(cfg) == {"Authorization": "Bearer k", "anthropic-version": "2023-06-01",
                                    "x-api-key": "k"}  # fmt: skip
    assert session_headers(cfg.model_copy(update={"endpoint": "chat"})) == {"Authorization": "Bearer k"}


def test_a_messages_workload_needs_the_served_model() -> None:
    with pytest.raises(ValueError, match="served model"):
        Workload(served("qwen3").tokenizer, config("qwen3", isl=100, request_count=2))


def test_replies_read_the_anthropic_answer() -> None:
    """JSON content text and SSE text deltas are the reply; the prompt is input_tokens plus the cache reads."""
    usage = {"input_tokens": 12, "output_tokens": 3, "cache_read_input_tokens": 32}
    answer = {"id": "msg_1", "type": "message", "role": "assistant", "usage": usage,
              "content": [{"type": "thinking", "thinking": "hm", "signature": "s"},
                          {"type": "text", "text": "Hel"}, {"type": "text", "text": "lo"}]}  # fmt: skip
    out = json_outcome(200, orjson.dumps(answer), 5.0)
    assert (out.reply, out.prompt_tokens, out.output_tokens, out.cached_tokens) == ("Hello", 44, 3, 32)
    start = {
        "type": "message_start",
        "message": {**answer, "content": [], "usage": {**usage, "output_tokens": 0}},
    }
    events = [
        ("message_start", start),
        ("content_block_start", {"type": "content_block_start", "index": 0,
                                 "content_block": {"type": "text", "text": ""}}),
        ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                 "delta": {"type": "text_delta", "text": "Hel"}}),
        ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                 "delta": {"type": "text_delta", "text": "lo"}}),
        ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "max_tokens"},
                           "usage": {"output_tokens": 3}}),
        ("message_stop", {"type": "message_stop"}),
    ]  # fmt: skip
    timer = StreamTimer()
    for i, (kind, data) in enumerate(events):
        for line in (b"event: " + kind.encode() + b"\n", b"data: " + orjson.dumps(data) + b"\n", b"\n"):
            timer.feed_line(line, float(i))
    streamed = timer.outcome(0.0, 9.0)
    assert (streamed.reply, streamed.prompt_tokens, streamed.output_tokens) == ("Hello", 44, 3)
    assert streamed.cached_tokens == 32 and streamed.ttft_ms == 2000.0 and streamed.itl_ms == 1000.0


# --- against the emulator -----------------------------------------------------------------------------------
# (family, streamed, the emulator's prefix cache): the fast lane runs each family once, JSON and streamed, with
# and without the cache; the whole suite every combination.
CASES = [("qwen3", False, True), ("llama-3.1", True, False), ("gemma-3", True, True)]
MORE = [(f, s, c) for f in ("qwen3", "llama-3.1", "gemma-3") for s in (False, True) for c in (False, True)]
ALL = CASES + [case for case in MORE if case not in CASES]
FAST_CASES = [pytest.param(*case, id="-".join(map(str, case))) for case in CASES]
SLOW_CASES = [pytest.param(*case, id="-".join(map(str, case)), marks=pytest.mark.slow) for case in ALL[3:]]


@pytest.mark.parametrize("family, streaming, prefix_cache", FAST_CASES + SLOW_CASES)
async def test_conversations_are_exact(family: str, streaming: bool, prefix_cache: bool) -> None:
    """Multi-turn with a marked shared system prompt: every request's server prompt (input + cache reads)
    equals its target; each turn adds the reply as rendered plus ISL; the cache is read past the first."""
    _, records = await run(family, conversation_config(family, streaming=streaming), prefix_cache)
    assert_exact(records, 2 * TURNS)
    for turns in by_conversation(records):
        assert [r.turn for r in turns] == [1, 2, 3] and turns[0].target_isl == ISL
        for prev, cur in itertools.pairwise(turns):
            assert cur.reply_tokens > 0  # the reply was read from the Messages answer
            assert cur.server_prompt_tokens == prev.server_prompt_tokens + cur.reply_tokens + ISL
            if prefix_cache:  # the whole history is a prefix of the next request: its blocks are cached
                assert cur.cached_prompt_tokens is not None and cur.cached_prompt_tokens >= 16
    cached = [r.cached_prompt_tokens for r in records]
    assert all(c is None for c in cached) if not prefix_cache else all(c is not None for c in cached)


@pytest.mark.parametrize("family, streaming, prefix_cache", FAST_CASES + SLOW_CASES)
async def test_agent_rounds_are_exact(family: str, streaming: bool, prefix_cache: bool) -> None:
    """Every request of every agent conversation at `isl + (turn - 1) * round_isl` as the server reports it,
    through its conversion of tool_use / tool_result blocks (Gemma 3: the round as text)."""
    cfg, records = await run(family, agent_config(family, streaming=streaming), prefix_cache)
    assert cfg.turns == ROUNDS + 1
    assert_exact(records, 2 * (ROUNDS + 1))
    for r in records:
        assert r.target_isl == AGENT_ISL + (r.turn - 1) * ROUND, r
    if prefix_cache:  # each round extends the request before it: its blocks are read from the cache
        for turns in by_conversation(records):
            assert all(r.cached_prompt_tokens and r.cached_prompt_tokens >= AGENT_ISL - 16 for r in turns[1:])


@pytest.mark.parametrize("family", sweep(["phi-3-mini-4k-instruct", "qwen2.5-instruct", "deepseek-r1",
                                          "mistral-7b-instruct-v0.1", "gpt-oss"]))  # fmt: skip
def test_agent_requests_on_more_families(family: str) -> None:
    """Built ahead (no server): the budget's count and the emulator's vLLM counting agree on every round."""
    cfg = agent_config(family)
    w = build_workload(served(family).tokenizer, cfg)[1]
    assert isinstance(w, AgentWorkload)
    for r in conversation_requests(w, "c0"):
        assert r.error is None and r.client_isl == r.target_isl, r
        assert emulator_count(family, r.body) == r.target_isl, (family, r.turn)


def test_a_dataset_agent_record_is_fitted(tmp_path: Path) -> None:
    """An OpenAI-format agent record on --endpoint messages: rewritten into blocks, its last tool result
    fitted to the record's ISL."""
    from tests.loadgen.test_agent_workload import AGENT_RECORD

    path = tmp_path / "agent.jsonl"
    path.write_bytes(orjson.dumps(AGENT_RECORD) + b"\n")
    cfg = LoadgenConfig(url="http://x", endpoint="messages", dataset=path, concurrency=1,
                        tokenizer=str(shared_dir("qwen3")))  # fmt: skip
    req: Request = build_workload(served("qwen3").tokenizer, cfg)[1].start("c0")[1]
    assert req.error is None and req.client_isl == req.target_isl == 700
    assert req.body["system"] == AGENT_RECORD["messages"][0]["content"]
    assert req.body["tools"] == anthropic_tools(AGENT_RECORD["tools"])
    results = req.body["messages"][-1]["content"]
    assert [b["type"] for b in results] == ["tool_result"] * 2
    assert results[1]["content"].startswith("ci: lint test")
    assert emulator_count("qwen3", req.body) == 700


async def test_through_the_proxy_every_round_is_exact() -> None:
    """Streamed agent rounds through the proxy to the emulator with its prefix cache on: the server's prompt
    equals each round's target and the proxy counts every Messages request exact."""
    from proxy.server.app import run_proxy
    from tests.server.helpers import proxy_config

    family = "qwen3"
    folder = str(shared_dir(family))
    runner, upstream = await start_emulator(
        EmulatorConfig(tokenizer=folder, prefix_cache=True), tokenizer=served(family).tokenizer
    )
    try:
        async with run_proxy(proxy_config(upstream, tokenizer=folder)) as (url, admin, _):
            before = await asyncio.to_thread(proxy_metrics.scrape, f"{admin}/metrics")
            assert before is not None
            cfg = agent_config(family, url, streaming=True)
            cfg, workload = build_workload(served(family).tokenizer, cfg)
            records = await Engine(cfg, workload).run()

            async def matches() -> dict[str, float]:
                after = await asyncio.to_thread(proxy_metrics.scrape, f"{admin}/metrics")
                assert after is not None
                return proxy_metrics.diff(before, after).get("islwatch_isl_match_total", {})

            n = len(records)
            settled = await eventually_async(
                matches, until=lambda m: sum(m.values()) >= n, what="match results"
            )
    finally:
        await runner.cleanup()
    assert_exact(records, 2 * (ROUNDS + 1))
    assert settled == {"exact": float(n)}
    assert all(r.cached_prompt_tokens for r in records if r.turn > 1)
