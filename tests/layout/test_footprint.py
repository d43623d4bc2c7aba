"""The event-loop process of process-mode analysis never imports transformers (issue 14, the footprint), nor
the template engine or the image library: the workers load the tokenizers, render, read images and report
their identities over the pipe, so the relay's process stays small (jinja2 and PIL alone: ~9 MB).
Checked in a fresh interpreter that runs a real proxy, waits for its worker to load, relays one request and
sees it analysed, then lists its own modules."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("transformers", "tokenizers", "torch", "huggingface_hub", "sentencepiece", "jinja2", "PIL", "numpy")

SCRIPT = textwrap.dedent(
    """
    import asyncio, json, sys
    import aiohttp
    from aiohttp import web
    from proxy.server.app import run_proxy
    from proxy.server.config import load_config
    from tests.server.helpers import value, wait_metrics

    async def upstream(request):
        await request.read()
        return web.json_response({"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 1}})

    async def main():
        app = web.Application()
        app.router.add_post("/v1/chat/completions", upstream)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        config = load_config({
            "upstream": f"http://127.0.0.1:{runner.addresses[0][1]}", "listen": "127.0.0.1:0",
            "admin": "127.0.0.1:0", "analysis_mode": "process", "server_probe": "off",
        }, env={})
        async with run_proxy(config) as (url, admin, _), aiohttp.ClientSession() as s:
            await wait_metrics(s, admin, lambda m: value(m, "islwatch_analysis_workers_live") >= 1)
            body = {"model": "m", "messages": [{"role": "user", "content": "Hello"}]}
            async with s.post(url + "/v1/chat/completions", json=body) as r:
                assert r.status == 200
            await wait_metrics(s, admin, lambda m: value(m, "islwatch_analysis_seconds_count") == 1)
            print(json.dumps(sorted({m.split(".")[0] for m in sys.modules})))
        await runner.cleanup()

    asyncio.run(main())
    """
)


def test_event_loop_process_does_not_import_transformers() -> None:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    assert out.returncode == 0, out.stderr[-3000:]
    modules = set(json.loads(out.stdout.strip().splitlines()[-1]))
    assert "aiohttp" in modules  # the listing is the proxy's own process
    assert not modules & set(HEAVY), sorted(modules & set(HEAVY))
