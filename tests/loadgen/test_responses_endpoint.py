"""`--endpoint responses`: the same exactness as chat (the templated count of the `input` items as the
server counts it; vLLM encodes a responses prompt with special tokens), streamed and not, multi-turn,
against the emulator and a real llama-server."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest

from loadgen.config import LoadgenConfig
from loadgen.send.runner import Engine, Record
from loadgen.workload.conversations import Workload
from proxy.emulator.app import EmulatorConfig, start_emulator
from tests.builders import build_tokenizer
from tests.conftest import load_builtin
from tests.loadgen.real_servers import qwen_llama_server


async def run(tok: Any, url: str, **kw: Any) -> list[Record]:
    base = {"url": url, "endpoint": "responses", "isl": 120, "osl": 5, "concurrency": 2, "request_count": 6}
    cfg = LoadgenConfig(**{**base, **kw})
    return await Engine(cfg, Workload(tok, cfg)).run()


def assert_exact(recs: list[Record], n: int) -> None:
    assert len(recs) == n
    for r in recs:
        assert r.error is None and r.budget_error is None, r
        assert r.client_isl == r.target_isl == r.server_prompt_tokens, r


def test_the_body_is_a_responses_request() -> None:
    cfg = LoadgenConfig(url="http://x", endpoint="responses", isl=64, osl=7, concurrency=1, request_count=1,
                        streaming=True)  # fmt: skip
    body = Workload(load_builtin().tokenizer, cfg).start("c0")[1].body
    assert set(body) == {"model", "input", "max_output_tokens", "stream"}
    assert body["max_output_tokens"] == 7 and body["input"][0]["role"] == "user"
    assert cfg.endpoint_url == "http://x/v1/responses"


@pytest.mark.parametrize("streaming", [False, True])
async def test_multi_turn_with_a_system_prompt_against_the_emulator(streaming: bool) -> None:
    tok = build_tokenizer("llama3")  # writes BOS itself: the responses path adds a second one, as vLLM does
    runner, url = await start_emulator(EmulatorConfig(), tokenizer=tok)
    try:
        recs = await run(tok, url, turns=3, streaming=streaming, shared_system_prompt_length=20,
                         cache_bust="system_suffix", request_count=9)  # fmt: skip
    finally:
        await runner.cleanup()
    assert_exact(recs, 9)
    by_conv = sorted(recs, key=lambda r: (r.conversation, r.turn))
    for _, turns in itertools.groupby(by_conv, key=lambda r: r.conversation):
        for prev, cur in itertools.pairwise(list(turns)):
            assert cur.server_prompt_tokens == prev.server_prompt_tokens + cur.reply_tokens + 120
            assert cur.reply_tokens > 0  # the reply text was read from the responses answer


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Any]]:
    with qwen_llama_server(tmp_path_factory.mktemp("llama-responses")) as server:
        yield server


@pytest.mark.llama_server
@pytest.mark.parametrize("streaming", [False, True])
async def test_against_llama_server(llama_server: tuple[str, Any], streaming: bool) -> None:
    url, tok = llama_server
    recs = await run(tok, url, turns=2, streaming=streaming, concurrency=1, request_count=4)
    assert_exact(recs, 4)
