"""Every drift cause, produced end to end: `islwatch emulate` with the matching `--fault` as the upstream,
the real proxy in front of it, a real HTTP client, and the cause read back from the proxy's metrics.

Also the live parity gauge and the opt-in mismatch dump, as the proxy wires them.
"""

from __future__ import annotations

import stat
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from prometheus_client import CollectorRegistry

from proxy.core import diagnose as d
from proxy.core.tokenizer import load_tokenizer
from proxy.emulator.app import EmulatorConfig, start_emulator
from proxy.emulator.faults import parse_faults
from proxy.server.app import run_proxy
from proxy.server.config import ProxyConfig
from tests.builders import save_tokenizer
from tests.conftest import shared_dir
from tests.eventually import eventually_async

USER = [{"role": "user", "content": "What is the capital of France?"}]
IMAGE = [
    {
        "role": "user",
        "content": [
            {"type": "text", "text": "What is in this picture?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
        ],
    }
]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


@pytest.fixture(scope="module")
def built_llama3(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A test-built tokenizer folder: BOS in the template and from the post-processor, 8-token gen prompt."""
    return save_tokenizer("llama3", str(tmp_path_factory.mktemp("llama3")))


@asynccontextmanager
async def proxied(
    spec: str, faults: list[str], registry: CollectorRegistry, **config: Any
) -> AsyncIterator[str]:
    emu_runner, emu_url = await start_emulator(
        EmulatorConfig(tokenizer=spec, faults=parse_faults(faults)), tokenizer=_loaded(spec)
    )
    try:
        cfg = ProxyConfig(
            upstream=emu_url,
            listen="127.0.0.1:0",
            admin="127.0.0.1:0",
            tokenizer=spec,
            analysis_mode="thread",
            **config,
        )
        async with run_proxy(cfg, registry) as urls:
            yield urls.url
    finally:
        await emu_runner.cleanup()


_LOADED: dict[str, Any] = {}


def _loaded(spec: str) -> Any:
    if spec not in _LOADED:
        _LOADED[spec] = load_tokenizer(spec)
    return _LOADED[spec]


def causes(registry: CollectorRegistry) -> dict[str, float]:
    out: dict[str, float] = {}
    for metric in registry.collect():
        if metric.name == "islwatch_drift":
            for s in metric.samples:
                if s.name == "islwatch_drift_total" and s.value:
                    out[s.labels["cause"]] = s.value
    return out


async def wait_for(registry: CollectorRegistry, total: int) -> dict[str, float]:
    """Analysis runs off the response path: wait until `total` requests were classified."""
    return await eventually_async(
        lambda: causes(registry), until=lambda seen: sum(seen.values()) >= total, what=f"{total} drift causes"
    )


async def send(url: str, body: dict[str, Any], stream: bool = False) -> None:
    async with aiohttp.ClientSession() as session:
        payload = {"model": "m", "max_tokens": 2, **body}
        if stream:
            payload |= {"stream": True, "stream_options": {"include_usage": True}}
        async with session.post(f"{url}/v1/chat/completions", json=payload) as resp:
            raw = await resp.read()
            assert resp.status == 200, raw[:300]


CASES = [
    # (faults, request body, expected cause)
    ([], {"messages": USER}, d.EXACT),
    (["double-bos"], {"messages": USER}, d.DUPLICATE_BOS),
    (["no-template"], {"messages": USER}, d.TEMPLATE_NOT_APPLIED),
    (["system-prompt=12"], {"messages": USER}, d.HIDDEN_SYSTEM_PROMPT),
    (["gen-prompt-off"], {"messages": USER}, d.GENERATION_PROMPT_MISMATCH),
    (["system-prompt=12"], {"messages": IMAGE}, d.MEDIA),
    (["system-prompt=12"], {"messages": USER, "tools": TOOLS}, d.TOOLS_UNMODELED),
    (["system-prompt=2"], {"messages": USER}, d.UNKNOWN),
]


@pytest.mark.parametrize(("faults", "body", "cause"), CASES, ids=[c[2] for c in CASES])
async def test_each_cause_through_the_proxy(
    built_llama3: str, faults: list[str], body: dict[str, Any], cause: str
) -> None:
    registry = CollectorRegistry()
    async with proxied(built_llama3, faults, registry) as url:
        await send(url, body)
        await send(url, body, stream=True)
        assert await wait_for(registry, 2) == {cause: 2.0}


SHARED_CASES = [
    ("mistral-7b-instruct-v0.1", "double-bos", d.DUPLICATE_BOS),
    ("mistral-7b-instruct-v0.1", "no-template", d.TEMPLATE_NOT_APPLIED),
    ("llama-3-8b-instruct", "double-bos", d.DUPLICATE_BOS),
    ("llama-3-8b-instruct", "gen-prompt-off", d.GENERATION_PROMPT_MISMATCH),
    ("qwen2.5-instruct", "double-bos", d.EXACT),  # no BOS to duplicate: the fault is harmless here
    ("qwen2.5-instruct", "system-prompt=20", d.HIDDEN_SYSTEM_PROMPT),
    ("qwen2.5-instruct", "gen-prompt-off", d.GENERATION_PROMPT_MISMATCH),
]


@pytest.mark.parametrize(("family", "fault", "cause"), SHARED_CASES)
async def test_causes_on_shared_tokenizers(family: str, fault: str, cause: str) -> None:
    spec = str(shared_dir(family))
    registry = CollectorRegistry()
    three = [*USER, {"role": "assistant", "content": "Paris."}, {"role": "user", "content": "And Italy?"}]
    async with proxied(spec, [fault], registry) as url:
        await send(url, {"messages": USER})
        await send(url, {"messages": three}, stream=True)
        assert await wait_for(registry, 2) == {cause: 2.0}


async def test_parity_gauge_is_set_at_start(built_llama3: str) -> None:
    registry = CollectorRegistry()
    async with proxied(built_llama3, ["double-bos"], registry):
        assert registry.get_sample_value("islwatch_parity_ok", {"model": "default"}) == 1.0


async def test_mismatch_dump_is_bounded_and_private(built_llama3: str, tmp_path: Path) -> None:
    registry = CollectorRegistry()
    dumps = tmp_path / "dumps"
    async with proxied(built_llama3, ["double-bos"], registry, dump_mismatches=str(dumps), dump_max=2) as url:
        for _ in range(3):
            await send(url, {"messages": USER})
        assert await wait_for(registry, 3) == {d.DUPLICATE_BOS: 3.0}
    files = sorted(dumps.glob("mismatch-*.json"))
    assert len(files) == 2  # bounded, oldest deleted
    assert stat.S_IMODE(dumps.stat().st_mode) == 0o700
    assert all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in files)
    record = orjson.loads(files[-1].read_bytes())
    assert record["cause"] == d.DUPLICATE_BOS
    assert record["server_prompt_tokens"] == record["count"]["templated"] + 1
