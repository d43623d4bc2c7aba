"""The server parity probe against the real emulator: a real proxy (thread analysis) in front of
`islwatch emulate`'s app. With the emulator's own tokenizer the probe finds parity; with the
`tokenizer=SPEC` fault (another tokenizer's files, the same template) it finds the difference, and a chat's
drift is named `server_tokenizer_differs`. The probe is awaited through its `.runs` counter, never a sleep."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from proxy.emulator.app import EmulatorConfig, start_emulator
from proxy.emulator.faults import parse_faults
from proxy.server.admin import PROBE
from proxy.server.app import run_proxy
from tests.builders import save_tokenizer
from tests.conftest import load_builtin, load_shared, shared_dir
from tests.eventually import eventually_async
from tests.server.helpers import fetch_metrics, proxy_config, value, wait_metrics

CHAT = {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "Hello there, how are you?"}]}


@pytest.fixture(scope="module")
def other_folder(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tokenizer folder unlike the proxy's default (builtin:mistral-v0.1): a small trained BPE."""
    return save_tokenizer("chatml", str(tmp_path_factory.mktemp("other") / "tok"))


@asynccontextmanager
async def proxied(*faults: str) -> AsyncIterator[tuple[str, str, Any]]:
    """An emulator with these faults (sharing the loaded built-in tokenizer), the proxy in front of it."""
    runner, emu_url = await start_emulator(
        EmulatorConfig(faults=parse_faults(faults)), tokenizer=load_builtin()
    )
    try:
        async with run_proxy(proxy_config(emu_url), CollectorRegistry()) as (url, admin_url, admin):
            await eventually_async(lambda: admin[PROBE].runs >= 1, what="one probe round")
            yield url, admin_url, admin
    finally:
        await runner.cleanup()


def classified(m: dict[Any, float]) -> bool:
    """The chat was analysed: matched exactly, or counted as a mismatch with its drift cause."""
    exact = value(m, "islwatch_isl_match_total", result="exact")
    return exact >= 1 or value(m, "islwatch_drift_total") >= 1


async def chat_metrics(url: str, admin_url: str) -> dict[Any, float]:
    async with aiohttp.ClientSession() as s:
        async with s.post(url + "/v1/chat/completions", json=CHAT) as r:
            assert r.status == 200, await r.text()
        return await wait_metrics(s, admin_url, classified)


async def test_emulators_own_tokenizer_has_parity() -> None:
    async with proxied() as (url, admin_url, _):
        async with aiohttp.ClientSession() as s:
            before = await fetch_metrics(s, admin_url)
            async with s.get(admin_url + "/readyz") as r:
                ready = await r.json()
        assert value(before, "islwatch_server_parity_ok", model="default") == 1
        assert ready["server_parity"] == {"default": "ok"}
        after = await chat_metrics(url, admin_url)
    assert value(after, "islwatch_isl_match_total", result="exact") == 1
    assert value(after, "islwatch_drift_total", cause="server_tokenizer_differs") == 0


async def test_swapped_tokenizer_fails_parity_and_names_the_cause(other_folder: str) -> None:
    async with proxied(f"tokenizer={other_folder}") as (url, admin_url, _):
        async with aiohttp.ClientSession() as s:
            before = await fetch_metrics(s, admin_url)
        assert ("islwatch_server_parity_ok", frozenset({("model", "default")})) in before
        assert value(before, "islwatch_server_parity_ok", model="default") == 0
        after = await chat_metrics(url, admin_url)
    assert value(after, "islwatch_isl_match_total", result="mismatch") == 1
    assert value(after, "islwatch_drift_total", cause="server_tokenizer_differs") == 1


async def test_other_server_template_kwargs_are_named_in_the_verdict() -> None:
    """The chat probe: the server (here the emulator, rendering Qwen3's template without server-wide kwargs)
    renders the probe chat itself; islwatch was told the server runs `enable_thinking: false`. The verdict
    differs and names the kwargs under which islwatch renders the server's ids (tests/vllm_server checks the
    same against a real vLLM)."""
    folder = str(shared_dir("qwen3"))
    runner, emu_url = await start_emulator(EmulatorConfig(tokenizer=folder), tokenizer=load_shared("qwen3"))
    config = proxy_config(emu_url, tokenizer=folder, default_chat_template_kwargs={"enable_thinking": False})
    try:
        async with run_proxy(config, CollectorRegistry()) as (_, admin_url, admin):
            await eventually_async(lambda: admin[PROBE].runs >= 1, what="one probe round")
            async with aiohttp.ClientSession() as s:
                metrics = await fetch_metrics(s, admin_url)
                async with s.get(admin_url + "/readyz") as r:
                    ready = await r.json()
    finally:
        await runner.cleanup()
    assert value(metrics, "islwatch_server_parity_ok", model="default") == 0
    assert ready["server_parity"] == {"default": "differs"}
    detail = ready["server_parity_detail"]["default"]
    assert "server parity ok" in detail  # every text probe equal: the tokenizer is the same
    assert "rendered chat differs" in detail and '{"enable_thinking": true}' in detail
