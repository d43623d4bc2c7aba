"""A near-zero-cost upstream: `islwatch emulate`'s recorded answers, with each request's exact prompt count.

The emulator tokenizes every prompt to report `usage.prompt_tokens` (~1-2 ms of CPU per 1,000-token chat),
which on a 2-core machine makes the upstream the bottleneck and hides the proxies' own cost. This server
replays answers recorded from the emulator (the same JSON, the same SSE events, each written as its own
chunk) with `prompt_tokens` / `total_tokens` filled in from a table computed before the run, keyed by the
request bytes' sha256, so the usage stays exact and the upstream costs only aiohttp's own handling.

Usage: python -m bench.replay_upstream (--recording FILE.json | --static) --listen 127.0.0.1:8001
FILE.json: {"json": str, "sse": [str, ...], "prompt_tokens": {"<sha256 of request body>": int}}; the
templates hold the placeholders __PROMPT__ and __TOTAL__. --static answers any request with a fixed reply.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

COMPLETION_TOKENS = 16  # the bench's max_tokens; the emulator answers exactly that many


@dataclass(frozen=True)
class Recording:
    json_template: bytes
    sse_template: tuple[bytes, ...]
    prompt_tokens: dict[str, int]
    static: bool


RECORDING = web.AppKey("recording", Recording)
_CHOICE = {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
_DELTA = {"id": "static", "object": "chat.completion.chunk", "created": 0, "model": "static"}
STATIC_JSON = json.dumps({"id": "static", "object": "chat.completion", "created": 0, "model": "static",
                          "choices": [_CHOICE],
                          "usage": {"prompt_tokens": "__PROMPT__", "total_tokens": "__TOTAL__"}})  # fmt: skip
STATIC_SSE = [
    "data: " + json.dumps({**_DELTA, "choices": [{"index": 0, "delta": {"content": "ok"}}]}) + "\n\n",
    "data: " + json.dumps({**_DELTA, "choices": [], "usage": {"prompt_tokens": "__PROMPT__"}}) + "\n\n",
    "data: [DONE]\n\n",
]


def fill(template: bytes, prompt: int) -> bytes:
    return template.replace(b'"__PROMPT__"', str(prompt).encode()).replace(
        b'"__TOTAL__"', str(prompt + COMPLETION_TOKENS).encode()
    )


async def replay(request: web.Request) -> web.StreamResponse:
    rec = request.app[RECORDING]
    body = await request.read()
    prompt = rec.prompt_tokens.get(hashlib.sha256(body).hexdigest())
    if prompt is None and not rec.static:
        return web.json_response({"error": {"message": "not recorded", "type": "bench"}}, status=404)
    prompt = prompt or 0
    if b'"stream":true' not in body:
        return web.Response(body=fill(rec.json_template, prompt), content_type="application/json")
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
    await resp.prepare(request)
    for chunk in rec.sse_template:
        await resp.write(fill(chunk, prompt) if b"__" in chunk else chunk)
    await resp.write_eof()
    return resp


async def health(_: web.Request) -> web.Response:
    return web.Response(text="ok")


def build_app(rec: Recording) -> web.Application:
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app[RECORDING] = rec
    app.router.add_get("/health", health)
    app.router.add_post("/v1/chat/completions", replay)
    return app


def load(path: str | None, static: bool) -> Recording:
    if path is None:
        return Recording(STATIC_JSON.encode(), tuple(c.encode() for c in STATIC_SSE), {}, True)
    d = json.loads(Path(path).read_text())
    return Recording(d["json"].encode(), tuple(c.encode() for c in d["sse"]), d["prompt_tokens"], static)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--recording", help="recorded templates and prompt counts (JSON)")
    p.add_argument("--static", action="store_true", help="answer unrecorded requests too (prompt_tokens 0)")
    p.add_argument("--listen", default="127.0.0.1:8001")
    args = p.parse_args()
    host, _, port = args.listen.rpartition(":")
    import uvloop

    web.run_app(build_app(load(args.recording, args.static)), host=host, port=int(port), access_log=None,
                loop=uvloop.new_event_loop(), print=lambda *_: None)  # fmt: skip


if __name__ == "__main__":
    main()
