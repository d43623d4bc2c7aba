"""`--workload agent` (loadgen/workload/agent.py): every request of an agent conversation at its exact target,
on every real tokenizer family (tests/data/tokenizers.toml), and the server's usage agreeing through the proxy.

The per-family checks count each request twice: through the flavor's path the budget used (core/model.py)
and, for the Jinja families, with the emulator's own vLLM counting (proxy/emulator/counting.py), a second
implementation that shares only the tokenizer calls. gpt-oss served as gpt-oss (config.json model_type) is
rendered with Harmony, which only the flavor's path models.
"""

from __future__ import annotations

import asyncio
import itertools
import shutil
from pathlib import Path
from typing import Any

import orjson
import pytest
from rich.console import Console

from loadgen.config import LoadgenConfig
from loadgen.report.model import build_report
from loadgen.report.table import print_report
from loadgen.send import proxy_metrics
from loadgen.send import runner as runner_module
from loadgen.send.orchestrate import prepare
from loadgen.send.runner import Engine
from loadgen.workload.agent import AgentWorkload, Shape, conversation_requests, tool_schemas
from loadgen.workload.conversations import Request
from loadgen.workload.dataset import DatasetWorkload, load_dataset
from loadgen.workload.mistral_text import MistralText
from loadgen.workload.sources import build_workload
from proxy.core.endpoints import Endpoint
from proxy.core.model import ServedModel, load_served_model
from proxy.core.renderers import HARMONY, MISTRAL
from proxy.core.renderers.mistral import tokenizer_file
from proxy.emulator.app import EmulatorConfig, start_emulator
from proxy.emulator.counting import chat_prompt_tokens
from proxy.emulator.faults import Faults
from tests.conftest import FAMILIES, shared_dir
from tests.core.test_mistral_mode import model_folder as mistral_model_folder
from tests.eventually import eventually_async
from tests.lanes import sweep

MODERN = ["qwen3", "llama-3.1", "gemma-3", "gpt-oss", "deepseek-r1"]
HARMONY_CASE = "gpt-oss as gpt_oss"  # the gpt-oss folder with config.json: vLLM renders it with Harmony
ISL, ROUND, ROUNDS, TOOLS = 1000, 120, 3, 3


def model_folder(family: str, tmp_path: Path) -> Path:
    if family != HARMONY_CASE:
        return shared_dir(family)
    folder = tmp_path / "gpt-oss"
    shutil.copytree(shared_dir("gpt-oss"), folder)
    (folder / "config.json").write_text('{"model_type": "gpt_oss"}')
    return folder


def agent_config(url: str = "http://x", **kw: Any) -> LoadgenConfig:
    base: dict[str, Any] = {
        "url": url, "workload": "agent", "isl": ISL, "round_isl": ROUND, "agent_rounds": ROUNDS,
        "tools": TOOLS, "parallel_calls": 3, "osl": 4, "concurrency": 1, "request_count": 1, "run_id": "agent",
    }  # fmt: skip
    return LoadgenConfig(**{**base, **kw})


def workload_for(served: ServedModel, **kw: Any) -> AgentWorkload:
    return AgentWorkload(served.tokenizer, agent_config(**kw), served=served)


def marked_workload(served: ServedModel) -> AgentWorkload:
    """A shared system prompt marked at its end where the template takes a system message (Mistral v0.1's
    does not: its first user turn is marked instead)."""
    w = workload_for(served, shared_system_prompt_length=40, cache_bust="system_suffix")
    try:
        w.preflight()
    except ValueError:
        return workload_for(served, cache_bust="first_turn_prefix")
    return w


def check_conversation(reqs: list[Request], w: AgentWorkload) -> None:
    assert [r.target_isl for r in reqs] == [ISL + k * ROUND for k in range(ROUNDS + 1)]
    assert [r.turn_isl for r in reqs] == [ISL] + [ROUND] * ROUNDS
    for r in reqs:
        assert r.error is None and r.client_isl == r.target_isl, (r.turn, r.error, r.client_isl, r.target_isl)
        assert r.body["tools"] == tool_schemas(TOOLS)
        assert orjson.loads(r.wire) == r.body
    for prev, cur in itertools.pairwise(reqs):  # each request extends the one before: the agent's prefix
        assert cur.body["messages"][: len(prev.body["messages"])] == prev.body["messages"]
    rounds = [m for m in reqs[-1].body["messages"] if m["role"] == "assistant"]
    assert len(rounds) == ROUNDS
    if w.shape is not Shape.TEXT:
        assert all(m["tool_calls"] for m in rounds)
        results = [m for m in reqs[-1].body["messages"] if m["role"] == "tool"]
        assert len(results) == sum(len(m["tool_calls"]) for m in rounds)


# Every family (seconds each): the whole suite; the fast lane runs the first.
@pytest.mark.parametrize("family", sweep([*FAMILIES, *MODERN, HARMONY_CASE]))
def test_every_request_is_exact_on_every_family(family: str, tmp_path: Path) -> None:
    served = load_served_model(str(model_folder(family, tmp_path)))
    w = marked_workload(served)
    convs = [conversation_requests(w, f"c{i}") for i in range(2)]
    for reqs in convs:
        check_conversation(reqs, w)
        if served.renderer == HARMONY:
            continue
        for r in reqs:  # the emulator's own vLLM counting, independent of the budget's path
            assert chat_prompt_tokens(served.tokenizer, Endpoint.CHAT, r.body, Faults()) == r.target_isl
    if w.cfg.cache_bust.value != "none":  # each conversation's marker differs, and stays in its history
        firsts = [orjson.dumps(reqs[0].body["messages"][0]) for reqs in convs]
        assert firsts[0] != firsts[1]
        assert all(reqs[0].marker and reqs[0].marker in reqs[-1].wire.decode() for reqs in convs)
    if family in ("qwen3", "qwen2.5-instruct", HARMONY_CASE):  # native tool calls, several in one turn
        assert w.shape is Shape.NATIVE and w.max_calls == 3
        calls = [
            len(m["tool_calls"]) for reqs in convs for m in reqs[-1].body["messages"] if m.get("tool_calls")
        ]
        assert max(calls) > 1
    if family == "llama-3.1":  # its template takes one call per assistant turn
        assert w.shape is Shape.NATIVE and w.max_calls == 1
    if family == "gemma-3":  # alternating user/assistant roles only: the round as text
        assert w.shape is Shape.TEXT


def test_qwen3_keeps_the_rounds_reasoning_in_the_count() -> None:
    """Qwen3 renders reasoning after the last user turn: every round's reasoning is in the budget."""
    served = load_served_model(str(shared_dir("qwen3")))
    reqs = conversation_requests(workload_for(served, round_isl=300), "c0")  # room for reasoning each round
    last = reqs[-1].body
    reasoning = [m["reasoning_content"] for m in last["messages"] if m.get("reasoning_content")]
    assert len(reasoning) == ROUNDS
    without = {**last, "messages": [{k: v for k, v in m.items() if k != "reasoning_content"}
                                    for m in last["messages"]]}  # fmt: skip
    dropped = served.count("chat", without).expected_server
    assert dropped is not None and dropped < reqs[-1].target_isl


@pytest.mark.parametrize(
    "kw, problem",
    [
        ({"round_isl": 0}, "needs --round-isl"),
        ({"endpoint": "completions"}, "needs --endpoint chat"),
        ({"parallel_calls": 5}, "--parallel-calls 5 is more than the --tools 3"),
        ({"turns": 2}, "leave --turns out"),
        ({"isl_stddev": 5.0}, "--isl-stddev does not combine"),
        ({"workload": "conversation"}, "need(s) --workload agent"),
    ],
)
def test_contradictions(kw: dict[str, Any], problem: str) -> None:
    with pytest.raises(ValueError, match=problem.replace("(", r"\(").replace(")", r"\)")):
        agent_config(**kw)


@pytest.mark.parametrize("family", sweep([*MODERN, *FAMILIES]))
async def test_through_the_proxy_the_server_counts_every_round(family: str) -> None:
    """Every shared family (Qwen3's reasoning kept, Llama 3.1's one call per turn, Gemma 3's and Mistral
    v0.1's rounds as text, ...): the emulator's usage.prompt_tokens equals each request's target, the proxy
    matches every request exactly, and the report's per-round table shows target and achieved."""
    from proxy.server.app import run_proxy
    from proxy.server.config import ProxyConfig

    folder = str(shared_dir(family))
    served = load_served_model(folder)
    runner, upstream = await start_emulator(EmulatorConfig(), tokenizer=served.tokenizer)
    config = ProxyConfig(upstream=upstream, listen="127.0.0.1:0", admin="127.0.0.1:0", tokenizer=folder,
                         analysis_mode="thread")  # fmt: skip
    try:
        async with run_proxy(config) as (url, admin_url, _):
            before = await asyncio.to_thread(proxy_metrics.scrape, f"{admin_url}/metrics")
            assert before is not None
            cfg = agent_config(url, concurrency=2, request_count=8, streaming=True, tokenizer=folder,
                               cache_bust="first_turn_prefix")  # fmt: skip
            cfg, workload = build_workload(served.tokenizer, cfg)
            records = await Engine(cfg, workload).run()

            async def matches() -> dict[str, float]:
                after = await asyncio.to_thread(proxy_metrics.scrape, f"{admin_url}/metrics")
                assert after is not None
                return proxy_metrics.diff(before, after).get("islwatch_isl_match_total", {})

            settled = await eventually_async(
                matches, until=lambda m: sum(m.values()) >= 8, what=f"{family}: 8 match results"
            )
    finally:
        await runner.cleanup()
    assert settled == {"exact": 8.0}, family
    assert cfg.turns == ROUNDS + 1 and len(records) == 8
    for r in records:
        assert r.error is None and r.budget_error is None, (family, r)
        assert r.server_prompt_tokens == r.client_isl == r.target_isl == ISL + (r.turn - 1) * ROUND, r
    report = build_report(records, run_id="agent", config=cfg.model_dump(mode="json"), tokenizer={},
                          overhead=None)  # fmt: skip
    assert [t.turn for t in report.turns] == [1, 2, 3, 4]
    for t in report.turns:
        assert t.server_mean == t.client_mean == t.target_mean == ISL + (t.turn - 1) * ROUND
    console = Console(record=True, width=200)
    print_report(console, report)
    text = console.export_text()
    assert "per round: target vs achieved" in text
    row = next(line for line in text.splitlines() if line.strip("│ ").startswith("3 "))
    assert row.count(f"{ISL + 3 * ROUND:,}.0") == 3  # target, client and server means of round 3


async def test_open_loop_sends_conversations_built_before_its_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """The open loop builds agent conversations whole before it starts sending (no budgeting on the sending
    loop), and sends the very bytes the conversation built ahead of time has, each at the server's count."""
    folder = str(shared_dir("qwen3"))
    served = load_served_model(folder)
    runner, upstream = await start_emulator(EmulatorConfig(), tokenizer=served.tokenizer)
    sent: list[tuple[str, int, bytes]] = []
    real_send = runner_module.send

    async def spy(session: Any, url: Any, req: Request, cfg: LoadgenConfig) -> Any:
        sent.append((req.conversation, req.turn, req.wire))
        return await real_send(session, url, req, cfg)

    monkeypatch.setattr(runner_module, "send", spy)
    cfg = agent_config(upstream, concurrency=None, request_rate=100, arrival="constant", request_count=10,
                       tokenizer=folder, cache_bust="first_turn_prefix")  # fmt: skip
    cfg, workload = build_workload(served.tokenizer, cfg)
    built_while_sending: list[str] = []
    clock = asyncio.Event()
    for name in ("start", "follow_up"):
        real = getattr(workload, name)

        def counted(*args: Any, _real: Any = real, _name: str = name) -> Any:
            if clock.is_set():
                built_while_sending.append(_name)
            return _real(*args)

        monkeypatch.setattr(workload, name, counted)
    try:
        records = await Engine(cfg, workload).run(ready=clock.set)
    finally:
        await runner.cleanup()
    assert clock.is_set() and built_while_sending == []
    assert len(records) == len(sent) == 10
    for r in records:
        assert r.error is None and r.budget_error is None, r
        assert r.server_prompt_tokens == r.client_isl == r.target_isl == ISL + (r.turn - 1) * ROUND, r
    ahead = agent_config(tokenizer=folder, cache_bust="first_turn_prefix")
    fresh = build_workload(
        served.tokenizer, ahead.model_copy(update={"request_rate": 100, "concurrency": None})
    )[1]
    assert isinstance(fresh, AgentWorkload)
    convs = {cid: conversation_requests(fresh, cid) for cid in {c for c, _, _ in sent}}
    for cid, turn, wire in sent:
        assert wire == convs[cid][turn - 1].wire, (cid, turn)
    by_conv: dict[str, list[int]] = {}
    for cid, turn, _ in sent:
        by_conv.setdefault(cid, []).append(turn)
    assert all(turns == list(range(1, len(turns) + 1)) for turns in by_conv.values())


def mistral_common_count(folder: Path, body: dict[str, Any]) -> int:
    """A wire body's prompt tokens by mistral-common itself (its OpenAI import and encoder, test mode as vLLM
    loads it), not through islwatch's request handling."""
    from mistral_common.protocol.instruct.request import ChatCompletionRequest
    from mistral_common.protocol.instruct.validator import ValidationMode
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

    tok = MistralTokenizer.from_file(str(tokenizer_file(folder)), mode=ValidationMode.test)
    request = ChatCompletionRequest.from_openai(messages=body["messages"], tools=body.get("tools"))
    return len(tok.encode_chat_completion(request).tokens)


@pytest.mark.parametrize("vocab", sweep(["nemo", "large-2411"], fast=1))  # Nemo: ~11 s of CPU
def test_every_request_is_exact_through_mistral_common(vocab: str, tmp_path: Path) -> None:
    """A model folder vLLM serves in its mistral tokenizer mode (only mistral-common's tokenizer file: Mistral
    Nemo's tekken, Mistral Large 2411's v7): the loadgen loads it as `islwatch loadgen` does and every agent
    request, then every turn of a plain conversation, is exactly its target by mistral-common's count."""
    folder = mistral_model_folder(tmp_path, vocab)
    cfg = agent_config(tokenizer=str(folder), shared_system_prompt_length=40, cache_bust="system_suffix")
    prepared = prepare(cfg)  # the CLI's start: tokenizer, workload, one request built, the overheads
    assert isinstance(prepared.loaded.tokenizer, MistralText) and prepared.loaded.identity.renderer == MISTRAL
    w = prepared.workload
    assert isinstance(w, AgentWorkload) and w.served is not None and w.served.mistral is not None
    # Nemo's format takes no text beside tool calls; Large 2411's takes the reasoning as content.
    assert w.shape is {"nemo": Shape.CALLS_ONLY, "large-2411": Shape.REASONING_IN_CONTENT}[vocab]
    assert w.max_calls == 3
    convs = [conversation_requests(w, f"c{i}") for i in range(2)]
    for reqs in convs:
        check_conversation(reqs, w)
        for r in reqs:
            assert mistral_common_count(folder, orjson.loads(r.wire)) == r.target_isl, (vocab, r.turn)
    assert (
        max(len(m["tool_calls"]) for reqs in convs for m in reqs[-1].body["messages"] if m.get("tool_calls"))
        > 1
    )
    assert all(reqs[0].marker and reqs[0].marker in reqs[-1].body["messages"][0]["content"] for reqs in convs)

    chat = LoadgenConfig(url="http://x", tokenizer=str(folder), isl=300, turns=3, osl=4, concurrency=1,
                         request_count=3, run_id="chat", cache_bust="first_turn_prefix")  # fmt: skip
    w2 = prepare(chat).workload
    conv, req = w2.start("c0")
    reqs = [req]
    for reply in ("Sure, here is the plan.", "Done: the tests pass now."):
        reqs.append(w2.follow_up(conv, reply))
    for r in reqs:
        assert r.error is None and r.client_isl == r.target_isl, (vocab, r.turn, r.error)
        assert mistral_common_count(folder, orjson.loads(r.wire)) == r.target_isl, (vocab, r.turn)
    assert [m["role"] for m in reqs[-1].body["messages"]] == ["user", "assistant"] * 2 + ["user"]
    assert all(later.target_isl - earlier.target_isl > 300 for earlier, later in itertools.pairwise(reqs))


AGENT_RECORD = {
    "messages": [
        {"role": "system", "content": "You are a coding agent. Use the tools."},
        {"role": "user", "content": "Why does the build fail on main?"},
        {"role": "assistant", "content": None, "reasoning_content": "I should look at the CI log first.",
         "tool_calls": [{"id": "a1b2c3d4e", "type": "function",
                         "function": {"name": "run_shell", "arguments": "{\"command\": \"make ci\"}"}},
                        {"id": "f5g6h7i8j", "type": "function",
                         "function": {"name": "read_file", "arguments": "{\"path\": \"Makefile\"}"}}]},
        {"role": "tool", "tool_call_id": "a1b2c3d4e", "content": "exit 2: missing header foo.h"},
        {"role": "tool", "tool_call_id": "f5g6h7i8j", "content": "ci: lint test"},
    ],
    "tools": tool_schemas(2),
    "isl": 700,
}  # fmt: skip


@pytest.mark.parametrize("family", sweep(["qwen3", "llama-3-8b-instruct", "qwen2.5-instruct", HARMONY_CASE]))
def test_dataset_agent_conversations_are_budgeted(family: str, tmp_path: Path) -> None:
    """An OpenAI-format agent record (reasoning, parallel tool calls, tool results, tools) at its asked count:
    the last tool result is fitted, the rest sent as written; without a count it goes as written."""
    folder = model_folder(family, tmp_path)
    as_written = {k: v for k, v in AGENT_RECORD.items() if k != "isl"}
    path = tmp_path / "agent.jsonl"
    path.write_bytes(orjson.dumps(AGENT_RECORD) + b"\n" + orjson.dumps(as_written) + b"\n")
    cfg = LoadgenConfig(url="http://x", dataset=path, concurrency=1, tokenizer=str(folder))
    served = load_served_model(str(folder))
    cfg, w = build_workload(served.tokenizer, cfg)
    assert isinstance(w, DatasetWorkload) and len(load_dataset(path)) == 2
    fitted, plain = w.start("c0")[1], w.start("c1")[1]
    assert fitted.error is None and fitted.client_isl == fitted.target_isl == 700
    msgs = fitted.body["messages"]
    assert msgs[:-1] == AGENT_RECORD["messages"][:-1] and msgs[-1]["content"].startswith("ci: lint test")
    assert fitted.body["tools"] == plain.body["tools"] == AGENT_RECORD["tools"]
    assert plain.body["messages"] == AGENT_RECORD["messages"] and plain.target_isl == plain.client_isl
    if served.renderer != HARMONY:
        assert chat_prompt_tokens(served.tokenizer, Endpoint.CHAT, fitted.body, Faults()) == 700
    else:  # Harmony: the flavor's count, not the Jinja template's
        assert w.served is not None and fitted.client_isl == served.count("chat", fitted.body).expected_server
