"""Asking the server how it tokenizes: its `/tokenize` endpoint, for the probe texts of core/probe.py.

Two request shapes, tried in this order and remembered per upstream:
- vLLM (`vllm/entrypoints/serve/tokenize/protocol.py` TokenizeCompletionRequest):
  `{"model", "prompt", "add_special_tokens": false}` -> `{"tokens": [...], "count", "max_model_len"}`;
- llama.cpp (`tools/server/server-context.cpp`, the tokenize handler): `{"content", "add_special": false,
  "parse_special": true}` -> `{"tokens": [...]}`.
A server that answers neither (404, 405, another body) has no usable `/tokenize`: its parity is unknown,
never a failure. Only probe texts are ever sent: no request content.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import aiohttp
import orjson

TIMEOUT_SECONDS = 10.0


def _vllm_body(model: str | None, text: str) -> dict[str, Any]:
    body: dict[str, Any] = {"prompt": text, "add_special_tokens": False}
    if model is not None:
        body["model"] = model
    return body


def _llama_cpp_body(model: str | None, text: str) -> dict[str, Any]:
    return {"content": text, "add_special": False, "parse_special": True}


SHAPES = {"vllm": _vllm_body, "llama.cpp": _llama_cpp_body}


def _tokens(raw: bytes) -> list[int] | None:
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    tokens = obj.get("tokens") if isinstance(obj, dict) else None
    if isinstance(tokens, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        return tokens
    return None


async def _one(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> list[int] | None:
    async with session.post(url, data=orjson.dumps(body), headers={"Content-Type": "application/json"}) as r:
        raw = await r.read()
    return _tokens(raw) if r.status == 200 else None


async def server_ids(
    session: aiohttp.ClientSession, base_url: str, model: str | None, texts: Sequence[str]
) -> tuple[str, list[list[int]]] | None:
    """(the shape that worked, the server's ids per text), or None when the server has no `/tokenize`.
    Transport errors propagate (the caller logs them: parity stays unknown until the next probe)."""
    url = base_url.rstrip("/") + "/tokenize"
    for shape, build in SHAPES.items():
        first = await _one(session, url, build(model, texts[0]))
        if first is None:
            continue
        rest = [await _one(session, url, build(model, t)) for t in texts[1:]]
        if any(ids is None for ids in rest):
            return None  # answered once, then not: nothing to compare
        return shape, [first, *(ids for ids in rest if ids is not None)]
    return None


def client_session() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT_SECONDS), trust_env=False)
