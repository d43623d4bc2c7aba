"""The floor: a minimal aiohttp pass-through proxy (one shared ClientSession, chunked relay, no analysis).

Usage: python -m bench.floor_proxy --upstream http://127.0.0.1:8000 --listen 127.0.0.1:9001
"""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web

HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
       "transfer-encoding", "upgrade", "host", "content-length"}  # fmt: skip
SESSION = web.AppKey("session", aiohttp.ClientSession)
UPSTREAM = web.AppKey("upstream", str)


async def relay(request: web.Request) -> web.StreamResponse:
    body = await request.read()
    headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP}
    url = request.app[UPSTREAM] + request.rel_url.path_qs
    async with request.app[SESSION].request(request.method, url, headers=headers, data=body) as up:
        resp = web.StreamResponse(status=up.status, reason=up.reason)
        for k, v in up.headers.items():
            if k.lower() not in HOP:
                resp.headers.add(k, v)
        await resp.prepare(request)
        async for chunk in up.content.iter_any():
            await resp.write(chunk)
        await resp.write_eof()
        return resp


def build_app(upstream: str) -> web.Application:
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app[UPSTREAM] = upstream.rstrip("/")

    async def session_ctx(app: web.Application) -> AsyncIterator[None]:
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector, auto_decompress=False) as session:
            app[SESSION] = session
            yield

    app.cleanup_ctx.append(session_ctx)
    app.router.add_route("*", "/{tail:.*}", relay)
    return app


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--upstream", required=True)
    p.add_argument("--listen", default="127.0.0.1:9001")
    args = p.parse_args()
    host, _, port = args.listen.rpartition(":")
    import uvloop

    web.run_app(build_app(args.upstream), host=host, port=int(port), access_log=None,
                loop=uvloop.new_event_loop(), print=lambda *_: None)  # fmt: skip


if __name__ == "__main__":
    main()
