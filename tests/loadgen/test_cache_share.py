"""The loadgen's cache-bust proof, short of a real cache (tests/vllm_server/test_vllm_bill.py has one): each
request's reported cached tokens, read from real answers' bytes, travel from the answer to its record, and the
report gives per turn and for the run the share of prompt tokens the server served from its cache."""

from __future__ import annotations

import asyncio
import io

import orjson
from aiohttp import web
from rich.console import Console

from loadgen.config import LoadgenConfig
from loadgen.report.model import build_report
from loadgen.report.table import print_report
from loadgen.send.replies import Record, StreamTimer, json_outcome
from loadgen.send.runner import Engine
from loadgen.workload.conversations import Workload
from tests.conftest import load_builtin
from tests.core.test_usage_fields import VLLM_CHAT_STREAM
from tests.server.helpers import serve_app


def rec(turn: int, prompt: int | None, cached: int | None, **kw: object) -> Record:
    base = dict(
        conversation="c0", turn=turn, warmup=False, turn_isl=100, target_isl=100, client_isl=100,
        server_prompt_tokens=prompt, reply_tokens=0, output_tokens=10, status=200, error=None,
        budget_error=None, sent_at=100.0, scheduled_at=None, send_lateness_ms=None, latency_ms=500.0,
        ttft_ms=None, itl_ms=None, cached_prompt_tokens=cached,
    )  # fmt: skip
    return Record(**{**base, **kw})  # type: ignore[arg-type]


RECORDS = [
    rec(1, 512, 0),
    rec(1, 512, 256),
    rec(1, 512, None),  # the server's usage did not say: out of the share, not counted as a miss
    rec(2, 1000, 512),
    rec(2, 1000, 512, warmup=True),  # warmup requests are not the run's
]


def test_share_per_turn_and_for_the_run() -> None:
    r = build_report(
        RECORDS, run_id="r", config={"cache_bust": "first_turn_prefix"}, tokenizer={}, overhead=None
    )
    turns = {t.turn: t.cache for t in r.turns}
    assert turns[1] is not None and turns[2] is not None and r.cache is not None
    assert (turns[1].reported, turns[1].cached_tokens, turns[1].prompt_tokens) == (2, 256, 1024)
    assert turns[1].share == 0.25
    assert (turns[2].reported, turns[2].share) == (1, 0.512)
    assert (r.cache.reported, r.cache.cached_tokens, r.cache.prompt_tokens) == (3, 768, 2024)


def rendered(records: list[Record], target: str) -> str:
    out = io.StringIO()
    report = build_report(records, run_id="r", config={"cache_bust": target}, tokenizer={}, overhead=None)
    print_report(Console(file=out, width=200), report)
    return out.getvalue()


def test_the_table_names_the_target_and_the_shares() -> None:
    text = rendered(RECORDS, "system_prefix")
    assert "(--cache-bust system_prefix)" in text
    rows = [line for line in text.splitlines() if line.startswith("│")]
    # turn 1: 256 of 1,024 tokens over 2 requests (means 128 and 512)
    assert any("25.00%" in line and "128.0" in line and "512.0" in line for line in rows)
    assert any("51.20%" in line for line in rows)


def test_no_table_when_no_answer_reported_cached_tokens() -> None:
    assert "prefix cache" not in rendered([rec(1, 512, None), rec(2, 900, None)], "none")


def test_cached_tokens_from_real_answers() -> None:
    """vLLM's captured stream (128 of 174 cached) and a JSON chat answer in vLLM's shape."""
    timer = StreamTimer()
    for line in "".join(VLLM_CHAT_STREAM).encode().splitlines(keepends=True):
        timer.feed_line(line, 0.0)
    assert timer.outcome(0.0, 1.0).cached_tokens == 128
    body = {
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Paris"}}],
        "usage": {"prompt_tokens": 263, "completion_tokens": 5, "total_tokens": 268,
                  "prompt_tokens_details": {"cached_tokens": 256}, "completion_tokens_details": None},
    }  # fmt: skip
    out = json_outcome(200, orjson.dumps(body), 1.0)
    assert (out.prompt_tokens, out.cached_tokens, out.output_tokens) == (263, 256, 5)
    no_details = {**body, "usage": {"prompt_tokens": 263, "completion_tokens": 5}}
    assert json_outcome(200, orjson.dumps(no_details), 1.0).cached_tokens is None


def test_the_runner_records_each_answers_cached_tokens() -> None:
    """A real HTTP server answering the n-th request with n * 16 cached tokens; each record has its own."""
    answered: list[int] = []

    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        answered.append(len(answered) + 1)
        usage = {
            "prompt_tokens": 64,
            "completion_tokens": 2,
            "prompt_tokens_details": {"cached_tokens": 16 * len(answered)},
        }
        reply = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}], "usage": usage}
        assert body["messages"]
        return web.json_response(reply)

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)

    async def run() -> list[Record]:
        async with serve_app(app) as url:
            cfg = LoadgenConfig(url=url, isl=64, osl=2, concurrency=1, request_count=3)
            return await Engine(cfg, Workload(load_builtin().tokenizer, cfg)).run()

    records = sorted(asyncio.run(run()), key=lambda r: r.sent_at)
    assert [r.cached_prompt_tokens for r in records] == [16, 32, 48]
