"""The issue's acceptance check: with the emulator and the proxy on each shared tokenizer, /metrics shows an
exact match for every text-only chat request (streamed and not). Needs the built test tokenizers (scripts/build_test_data.py)."""

from __future__ import annotations

import aiohttp

from proxy.emulator.app import EmulatorConfig, build_emulator_app
from proxy.server.app import run_proxy
from tests.conftest import load_shared, shared_dir
from tests.server.helpers import proxy_config, serve_app, settled, value, wait_metrics

CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a colour."}],
    [
        {"role": "user", "content": "Hi!"},
        {"role": "assistant", "content": "Hello. How can I help?"},
        {"role": "user", "content": "Unicode: café, 東京, 🙂 and  double  spaces.\nNew line."},
    ],
]


async def test_every_text_only_chat_is_an_exact_match(shared_family: str) -> None:
    folder = str(shared_dir(shared_family))
    loaded = load_shared(shared_family)
    async with (
        serve_app(build_emulator_app(EmulatorConfig(tokenizer=folder), tokenizer=loaded)) as emulator,
        run_proxy(proxy_config(emulator, tokenizer=folder)) as (url, admin, _),
        aiohttp.ClientSession() as s,
    ):
        accepted = 0
        for messages in CONVERSATIONS:
            for extra in ({}, {"stream": True, "stream_options": {"include_usage": True}}):
                body = {"model": "m", "max_tokens": 2, "messages": messages, **extra}
                async with s.post(url + "/v1/chat/completions", json=body) as r:
                    await r.read()
                    # Templates that refuse a system role answer 400 (the server renders it the same way).
                    assert r.status in (200, 400)
                    accepted += r.status == 200
        assert accepted >= 4
        m = await wait_metrics(
            s,
            admin,
            lambda m: settled(m) and value(m, "islwatch_isl_match_total", endpoint="chat") == accepted,
        )
        assert value(m, "islwatch_isl_match_total", endpoint="chat", result="exact") == accepted
        assert value(m, "islwatch_drift_total", cause="exact") == accepted
        assert value(m, "islwatch_isl_drift_tokens_sum") == 0
