"""A near-zero-cost upstream: replays responses recorded from `islwatch emulate`, looked up by request bytes.

The emulator tokenizes every prompt to report `usage.prompt_tokens` (~1-2 ms of CPU per 1,000-token chat),
which on a 2-core machine makes the upstream the bottleneck and hides the proxies' own cost. Replaying its
recorded bytes (same JSON, same SSE events, each written as its own chunk) keeps the traffic and the usage
exact while the upstream costs only aiohttp's own request handling.

Usage: python -m bench.replay_upstream (--recording FILE.json | --static) --listen 127.0.0.1:8001
FILE.json: {"<sha256 of request body>": {"content_type": str, "chunks": [str, ...]}, ...}
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

from aiohttp import web

RECORDING = web.AppKey("recording", dict)
STATIC = web.AppKey("static", bool)
# --static: any request not recorded gets one fixed short answer (for load generators with their own bodies).
_CHOICE = {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
_USAGE = {"prompt_tokens": 0, "completion_tokens": 1, "total_tokens": 1}
STATIC_JSON = json.dumps({"id": "static", "object": "chat.completion", "created": 0, "model": "static",
                          "choices": [_CHOICE], "usage": _USAGE}).encode()  # fmt: skip
_DELTA = {"id": "static", "object": "chat.completion.chunk", "created": 0, "model": "static"}
STATIC_SSE = [
    f"data: {json.dumps({**_DELTA, 'choices': [{'index': 0, 'delta': {'role': 'assistant', 'content': 'ok'}}]})}\n\n".encode(),
    f"data: {json.dumps({**_DELTA, 'choices': [{'index': 0, 'delta': {}, 'finish_reason': 'stop'}], 'usage': _USAGE})}\n\n".encode(),
    b"data: [DONE]\n\n",
]


async def replay(request: web.Request) -> web.StreamResponse:
    body = await request.read()
    entry = request.app[RECORDING].get(hashlib.sha256(body).hexdigest())
    if entry is None and request.app[STATIC]:
        stream = b'"stream":true' in body.replace(b" ", b"")
        entry = {"content_type": "text/event-stream" if stream else "application/json",
                 "chunks": STATIC_SSE if stream else [STATIC_JSON]}  # fmt: skip
    if entry is None:
        return web.json_response({"error": {"message": "not recorded", "type": "bench"}}, status=404)
    if len(entry["chunks"]) == 1:
        return web.Response(
            body=entry["chunks"][0], content_type=None, headers={"Content-Type": entry["content_type"]}
        )
    resp = web.StreamResponse(headers={"Content-Type": entry["content_type"], "Cache-Control": "no-cache"})
    await resp.prepare(request)
    for chunk in entry["chunks"]:
        await resp.write(chunk)
    await resp.write_eof()
    return resp


async def health(_: web.Request) -> web.Response:
    return web.Response(text="ok")


def build_app(recording: dict[str, dict], static: bool = False) -> web.Application:
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app[STATIC] = static
    app[RECORDING] = {
        k: {"content_type": v["content_type"], "chunks": [c.encode() for c in v["chunks"]]}
        for k, v in recording.items()
    }
    app.router.add_get("/health", health)
    app.router.add_post("/v1/chat/completions", replay)
    return app


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--recording", help="recorded responses (JSON); none: --static answers everything")
    p.add_argument("--static", action="store_true", help="answer unrecorded requests with a fixed reply")
    p.add_argument("--listen", default="127.0.0.1:8001")
    args = p.parse_args()
    host, _, port = args.listen.rpartition(":")
    import uvloop

    recording = json.loads(Path(args.recording).read_text()) if args.recording else {}
    app = build_app(recording, static=args.static)
    web.run_app(
        app, host=host, port=int(port), access_log=None, loop=uvloop.new_event_loop(), print=lambda *_: None
    )


if __name__ == "__main__":
    main()
