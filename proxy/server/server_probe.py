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

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import Any

import aiohttp
import orjson

from proxy.core.probe import ChatProbe, Probe, chat_summary, compare, summary
from proxy.server.metrics import Metrics
from proxy.server.pool import AnalysisPool
from proxy.server.records import TokenizerReport

log = logging.getLogger("islwatch.probe")

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
        # llama-server answers a body without `content` with `{"tokens": []}`: the first probe text is a
        # sentence, so an empty answer means the shape is not this server's. (Later texts may really
        # tokenize to nothing on the server: vLLM 0.32's DeepSeek-V3 tokenizer drops emoji.)
        if not first:
            continue
        rest = [await _one(session, url, build(model, t)) for t in texts[1:]]
        if any(ids is None for ids in rest):
            return None  # answered once, then not: nothing to compare
        return shape, [first, *(ids for ids in rest if ids is not None)]
    return None


async def server_chat_ids(
    session: aiohttp.ClientSession, base_url: str, model: str | None, probe: ChatProbe
) -> list[int] | None:
    """The server's ids for the chat probe: vLLM's `/tokenize` renders messages with its own template and
    its server-wide kwargs (TokenizeChatRequest; `add_special_tokens` false, as islwatch encodes the
    render). None when it does not answer that shape."""
    body: dict[str, Any] = {
        "messages": probe.messages,
        "add_generation_prompt": True,
        "add_special_tokens": False,
    }
    if model is not None:
        body["model"] = model
    return await _one(session, base_url.rstrip("/") + "/tokenize", body)


def client_session() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT_SECONDS), trust_env=False)


async def probe_reports(
    session: aiohttp.ClientSession, base_url: str, reports: Sequence[TokenizerReport]
) -> dict[str, tuple[bool | None, str]]:
    """Per model label: (verdict, one content-free log line). None: the server has no /tokenize, or it
    failed (unknown, never a failure)."""
    out: dict[str, tuple[bool | None, str]] = {}
    for r in reports:
        if r.error or not r.probes or r.probe_ids is None:
            continue
        probe_set = [Probe(name, text) for name, text in r.probes]
        try:
            answer = await server_ids(session, base_url, r.key or None, [p.text for p in probe_set])
        except Exception as exc:  # the probe must never stop the proxy; parity stays unknown, logged
            out[r.label] = (None, f"server parity unknown: /tokenize failed ({type(exc).__name__})")
            continue
        if answer is None:
            out[r.label] = (None, "server parity unknown: the server has no usable /tokenize")
            continue
        shape, theirs = answer
        results = compare(probe_set, r.probe_ids, theirs)
        ok, line = all(x.equal for x in results), f"{summary(results)} ({shape} /tokenize)"
        if shape == "vllm" and r.chat_probe is not None:  # llama-server's /tokenize takes no messages
            chat = ChatProbe(r.chat_probe[0], r.chat_probe[1], [(k, ids) for k, ids in r.chat_probe[2]])
            try:
                chat_ids = await server_chat_ids(session, base_url, r.key or None, chat)
            except Exception as exc:  # as above: never stops the proxy
                chat_ids, line = None, f"{line}; rendered chat unknown ({type(exc).__name__})"
            if chat_ids is not None:
                ok = ok and chat_ids == chat.ours
                line = f"{line}; {chat_summary(chat, chat_ids)}"
        out[r.label] = (ok, line)
    return out


class ServerProbe:
    """Runs the probe when the pool (re)loads its tokenizers and every `interval` seconds after."""

    def __init__(self, base_url: str, interval: float, metrics: Metrics) -> None:
        self.base_url = base_url
        self.interval = interval
        self.metrics = metrics
        self.due = asyncio.Event()  # set by the pool on every successful (re)load
        self.runs = 0  # probe rounds finished (tests wait on it)
        self.lines: dict[str, str] = {}  # per model label, the last verdict's content-free line (/readyz)

    async def run(self, pool: AnalysisPool) -> None:
        async with client_session() as session:
            while True:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.due.wait(), self.interval)
                self.due.clear()
                if pool.ready:
                    await self.once(session, pool.reports)

    async def once(self, session: aiohttp.ClientSession, reports: Sequence[TokenizerReport]) -> None:
        for label, (ok, line) in (await probe_reports(session, self.base_url, reports)).items():
            self.metrics.server_probed(label, ok)
            self.lines[label] = line
            log.log(logging.WARNING if ok is False else logging.INFO, "model %s: %s", label, line)
        self.runs += 1
