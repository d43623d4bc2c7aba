"""`islwatch emulate`: an OpenAI-compatible upstream that counts prompts the way vLLM does, with fault switches.

It answers `/v1/chat/completions`, `/v1/completions`, `/v1/embeddings`, `/v1/responses` (JSON and SSE),
`/v1/models` and `/health`. The answer text is deterministic: exactly `max_tokens` tokens of the emulator's
tokenizer. `usage.prompt_tokens` is computed on vLLM's path, deliberately not through
`proxy.count.count_request`, so the proxy's counting core is checked against a second implementation:

- chat / responses: vLLM prepares the messages (`chat_utils.py`), renders the template with
  `tokenize=False`, then encodes the text with `add_special_tokens` from the request (default False;
  `serving_engine.py` `_preprocess_chat`);
- completions / embeddings: a plain encode with special tokens (default True); token-id prompts as given.

Faults (`proxy.emulate_faults`) make the count drift the way real deployments do, or make requests fail.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import dataclasses
import hashlib
import logging
import math
import random
import struct
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

import orjson
from aiohttp import web

from proxy.core.endpoints import Endpoint
from proxy.core.extract import ChatInput, InvalidBody, chat_input, prompt_input, responses_input
from proxy.core.specs import DEFAULT_TOKENIZER
from proxy.core.tokenizer import LoadedTokenizer, TokenizerLoadError, load_tokenizer
from proxy.core.tokens import iterates_content_parts, template_of
from proxy.emulator.faults import Faults, parse_faults

log = logging.getLogger("islwatch.emulate")

DEFAULT_MAX_TOKENS = 16  # OpenAI's and vLLM's completions default; used for every endpoint here
# A fixed `created` keeps responses byte-for-byte reproducible (the proxy's byte-identity tests rely on it).
FIXED_CREATED = 1_700_000_000
NO_TEMPLATE_JOIN = "\n"  # `no-template` joins message texts like vLLM joins text parts
WORD_CANDIDATES = ("the", "yes", "ok", "hello", "a", "go", "is", "and")
RESET_AFTER_CHUNKS = 3  # `reset-mid-stream`: chunks written before the transport is aborted


@dataclass(frozen=True)
class EmulatorConfig:
    """Everything one emulator app needs. `models` empty: the tokenizer spec is the model name, as in vLLM."""

    tokenizer: str = DEFAULT_TOKENIZER
    models: tuple[str, ...] = ()
    chat_template: str | None = None  # file overriding the tokenizer's template
    faults: Faults = field(default_factory=Faults)
    seed: int = 0
    default_max_tokens: int = DEFAULT_MAX_TOKENS
    max_tokens_limit: int = 1_000_000
    # vLLM answers 404 for a model it does not serve; off by default so proxy tests can send any name.
    strict_models: bool = False
    embedding_dim: int = 8
    created: int | None = FIXED_CREATED  # None: wall clock

    @property
    def served_models(self) -> tuple[str, ...]:
        return self.models or (self.tokenizer,)


@dataclass
class EmulatorStats:
    """What reached the emulator; tests of the proxy read it (also served at GET /emulator/stats)."""

    requests: int = 0
    streams_started: int = 0
    streams_completed: int = 0
    streams_reset: int = 0  # cut by the reset-mid-stream fault
    client_disconnects: int = 0  # the client (or proxy) went away mid-stream
    status_faults: int = 0

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


class RequestError(Exception):
    """A request the emulator refuses, answered as vLLM's JSON error body."""

    def __init__(self, message: str, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.param = param


def error_body(message: str, status: int, param: str | None = None) -> bytes:
    # vLLM's ErrorResponse: {"error": {"message", "type", "param", "code"}} (the shape the openai client reads).
    try:
        kind = "".join(HTTPStatus(status).phrase.split()) + "Error"  # 503 -> ServiceUnavailableError
    except ValueError:
        kind = "Error"
    return orjson.dumps({"error": {"message": message, "type": kind, "param": param, "code": status}})


def error_response(message: str, status: int, param: str | None = None) -> web.Response:
    return web.Response(
        body=error_body(message, status, param), status=status, content_type="application/json"
    )


# ---------------------------------------------------------------------------------------------------------
# Counting: vLLM's path, on the emulator's own tokenizer. Pure functions of (tokenizer, body, faults).


def _encode_len(tok: Any, text: str, add_special_tokens: bool) -> int:
    return len(tok(text, add_special_tokens=add_special_tokens)["input_ids"])


def _parse_chat(tok: Any, endpoint: Endpoint, body: Any) -> ChatInput:
    template = template_of(tok)
    parts_format = template is not None and iterates_content_parts(template)
    try:
        if endpoint == Endpoint.RESPONSES:
            return responses_input(body, parts_format)
        chat = chat_input(body, parts_format)
    except InvalidBody as exc:
        raise RequestError(str(exc)) from None
    if endpoint == Endpoint.EMBEDDINGS:
        # vLLM's EmbeddingChatRequest defaults add_generation_prompt to False (chat completions: True).
        chat = dataclasses.replace(chat, add_generation_prompt=bool(body.get("add_generation_prompt", False)))
    return chat


def chat_prompt_tokens(tok: Any, endpoint: Endpoint, body: Any, faults: Faults) -> int:
    """prompt_tokens of a chat-shaped request (chat, responses, chat-style embeddings) as vLLM reports it."""
    chat = _parse_chat(tok, endpoint, body)
    if chat.continue_final_message and chat.add_generation_prompt:
        # vLLM's request validator (ChatCompletionRequest.check_generation_prompt) refuses this pair.
        raise RequestError("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
    if faults.no_template:
        # A server without a template: the texts, joined, encoded plainly (BOS included).
        count = _encode_len(tok, NO_TEMPLATE_JOIN.join(chat.texts), add_special_tokens=True)
        return count + faults.system_prompt_tokens
    if template_of(tok) is None:
        raise RequestError(
            "As of transformers v4.44, default chat template is no longer allowed, so you must provide a "
            "chat template if the tokenizer does not define one."
        )
    try:
        rendered = tok.apply_chat_template(
            chat.messages,
            tools=chat.tools,
            documents=chat.documents,
            add_generation_prompt=chat.add_generation_prompt and not faults.gen_prompt_off,
            continue_final_message=chat.continue_final_message,
            tokenize=False,
            **chat.template_kwargs,
        )
    except Exception as exc:  # jinja2 errors, raise_exception(), bad kwargs: vLLM answers 400 with the text
        raise RequestError(f"chat template error: {exc}") from None
    if not isinstance(rendered, str):
        raise RequestError("chat template did not render to text")
    add_special = chat.add_special_tokens or faults.double_bos
    return _encode_len(tok, rendered, add_special_tokens=add_special) + faults.system_prompt_tokens


def prompt_token_counts(tok: Any, body: Any, field_name: str) -> tuple[int, ...]:
    """Per-prompt counts of completions (`prompt`) / embeddings (`input`): plain encode or ids as given."""
    try:
        inp = prompt_input(body, field_name)
    except InvalidBody as exc:
        raise RequestError(str(exc), param=field_name) from None
    return tuple(
        _encode_len(tok, p, inp.add_special_tokens) if isinstance(p, str) else len(p) for p in inp.prompts
    )


def pick_word(tok: Any) -> str:
    """A word that is one token each time it repeats, so `n` repeats are exactly `n` output tokens."""
    for word in WORD_CANDIDATES:
        if all(_encode_len(tok, " ".join([word] * n), False) == n for n in (1, 2, 3, 17)):
            return word
    raise ValueError("no single-token word found for the emulator's answer text")


# ---------------------------------------------------------------------------------------------------------
# One request, planned before any byte is written.


@dataclass(frozen=True)
class Plan:
    endpoint: Endpoint
    model: str
    rid: str
    created: int
    prompts: tuple[int, ...]  # prompt_tokens per prompt (one for chat / responses)
    max_tokens: int
    stream: bool
    include_usage: bool
    continuous_usage: bool
    body: dict[str, Any]

    @property
    def prompt_tokens(self) -> int:
        return sum(self.prompts)

    @property
    def completion_tokens(self) -> int:
        return 0 if self.endpoint == Endpoint.EMBEDDINGS else self.max_tokens * len(self.prompts)


class Emulator:
    """Per-app state: the tokenizer (loaded once), the answer word, the seeded fault RNGs, counters."""

    def __init__(self, config: EmulatorConfig, loaded: LoadedTokenizer | Any) -> None:
        self.config = config
        self.tok = loaded.tokenizer if isinstance(loaded, LoadedTokenizer) else loaded
        self.word = pick_word(self.tok)
        # One RNG per fault, so switching one fault on does not move the other's decisions.
        self.status_rng = random.Random(f"{config.seed}:status")
        self.reset_rng = random.Random(f"{config.seed}:reset")
        self.stats = EmulatorStats()
        self._models_body = orjson.dumps(
            {
                "object": "list",
                "data": [
                    {
                        "id": m,
                        "object": "model",
                        "created": self._created(),
                        "owned_by": "islwatch-emulate",
                        "root": m,
                        "parent": None,
                    }
                    for m in config.served_models
                ],
            }
        )

    def _created(self) -> int:
        return int(time.time()) if self.config.created is None else self.config.created

    def draw_status(self) -> int | None:
        f = self.config.faults
        if f.status is not None and self.status_rng.random() < f.status_rate:
            return f.status
        return None

    def draw_reset(self) -> bool:
        rate = self.config.faults.reset_rate
        return rate > 0 and self.reset_rng.random() < rate

    def text(self, n: int) -> str:
        return " ".join([self.word] * n)

    def pieces(self, n: int) -> Iterator[str]:
        """The answer one token at a time; the pieces join to `text(n)`."""
        for i in range(n):
            yield self.word if i == 0 else " " + self.word

    def _max_tokens(self, body: dict[str, Any], names: tuple[str, ...]) -> int:
        for name in names:
            value = body.get(name)
            if value is None:
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise RequestError(f"{name} must be an integer of at least 1", param=name)
            if value > self.config.max_tokens_limit:
                raise RequestError(f"{name} is above {self.config.max_tokens_limit}", param=name)
            return value
        return self.config.default_max_tokens

    def plan(self, endpoint: Endpoint, raw: bytes) -> Plan:
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise RequestError("request body is not valid JSON") from None
        if not isinstance(body, dict):
            raise RequestError("request body is not a JSON object")
        model = body.get("model")
        served = self.config.served_models
        if self.config.strict_models and model is not None and model not in served:
            raise RequestError(f"The model `{model}` does not exist.", status=404, param="model")
        if body.get("n") not in (None, 1):
            raise RequestError("the emulator answers n=1 only", param="n")
        faults = self.config.faults
        if endpoint == Endpoint.COMPLETIONS:
            prompts = prompt_token_counts(self.tok, body, "prompt")
        elif endpoint == Endpoint.EMBEDDINGS and not isinstance(body.get("messages"), list):
            prompts = prompt_token_counts(self.tok, body, "input")
        else:
            prompts = (chat_prompt_tokens(self.tok, endpoint, body, faults),)
        names = {
            Endpoint.CHAT: ("max_completion_tokens", "max_tokens"),
            Endpoint.COMPLETIONS: ("max_tokens",),
            Endpoint.RESPONSES: ("max_output_tokens",),
            Endpoint.EMBEDDINGS: (),
        }[endpoint]
        raw_options = body.get("stream_options")
        options: dict[str, Any] = raw_options if isinstance(raw_options, dict) else {}
        stream = bool(body.get("stream", False)) and endpoint != Endpoint.EMBEDDINGS
        prefix = {"chat": "chatcmpl-", "completions": "cmpl-", "embeddings": "embd-", "responses": "resp_"}
        return Plan(
            endpoint=endpoint,
            model=model if isinstance(model, str) else served[0],
            # Derived from the body: the same request gets the same id, so answers are reproducible.
            # stream_options is left out, so a proxy that injects include_usage sees the same id.
            rid=prefix[endpoint] + _request_digest(body),
            created=self._created(),
            prompts=prompts,
            max_tokens=self._max_tokens(body, names),
            stream=stream,
            include_usage=bool(options.get("include_usage")),
            continuous_usage=bool(options.get("continuous_usage_stats")),
            body=body,
        )


EMULATOR = web.AppKey("emulator", Emulator)


# ---------------------------------------------------------------------------------------------------------
def _request_digest(body: dict[str, Any]) -> str:
    stable = {k: v for k, v in body.items() if k != "stream_options"}
    return hashlib.sha256(orjson.dumps(stable, option=orjson.OPT_SORT_KEYS)).hexdigest()[:32]


# Response bodies and streams (shapes follow vLLM's protocol.py, which follows the OpenAI API reference).


def usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion}


def _responses_usage(prompt: int, completion: int) -> dict[str, Any]:
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + completion,
    }


def _embedding(dim: int, encoding: Any) -> list[float] | str:
    values = [1.0 / math.sqrt(dim)] * dim  # deterministic and unit-length, like a normalized pooler output
    if encoding == "base64":  # the openai client asks for base64 float32 by default
        return base64.b64encode(struct.pack(f"<{dim}f", *values)).decode("ascii")
    return values


def _message_item(plan: Plan, text: str, status: str) -> dict[str, Any]:
    content = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}] if text else []
    return {
        "type": "message",
        "id": "msg_" + plan.rid[5:],
        "role": "assistant",
        "status": status,
        "content": content,
    }


def _response_object(plan: Plan, text: str | None) -> dict[str, Any]:
    done = text is not None
    body = plan.body
    return {
        "id": plan.rid,
        "object": "response",
        "created_at": plan.created,
        "model": plan.model,
        "status": "completed" if done else "in_progress",
        "error": None,
        "incomplete_details": None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "metadata": body.get("metadata") or {},
        "output": [_message_item(plan, text or "", "completed")] if done else [],
        "parallel_tool_calls": True,
        "temperature": body.get("temperature", 1.0),
        "text": {"format": {"type": "text"}},
        "tool_choice": "auto",
        "tools": [],
        "top_p": body.get("top_p", 1.0),
        "truncation": "disabled",
        "usage": _responses_usage(plan.prompt_tokens, plan.completion_tokens) if done else None,
    }


def full_body(emu: Emulator, plan: Plan) -> dict[str, Any]:
    """The non-streaming answer."""
    text = emu.text(plan.max_tokens)
    kind = {Endpoint.CHAT: "chat.completion", Endpoint.COMPLETIONS: "text_completion"}.get(
        plan.endpoint, "list"
    )
    head = {"id": plan.rid, "object": kind, "created": plan.created, "model": plan.model}
    use = usage(plan.prompt_tokens, plan.completion_tokens)
    if plan.endpoint == Endpoint.CHAT:
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": text, "tool_calls": []},
            "logprobs": None,
            "finish_reason": "length",
            "stop_reason": None,
        }
        return {**head, "choices": [choice], "usage": use}
    if plan.endpoint == Endpoint.COMPLETIONS:
        choices = [
            {"index": i, "text": text, "logprobs": None, "finish_reason": "length", "stop_reason": None}
            for i in range(len(plan.prompts))
        ]
        return {**head, "choices": choices, "usage": use}
    if plan.endpoint == Endpoint.EMBEDDINGS:
        dim = plan.body.get("dimensions")
        dim = (
            dim
            if isinstance(dim, int) and not isinstance(dim, bool) and dim > 0
            else emu.config.embedding_dim
        )
        encoding = plan.body.get("encoding_format")
        data = [
            {"index": i, "object": "embedding", "embedding": _embedding(dim, encoding)}
            for i in range(len(plan.prompts))
        ]
        return {**head, "data": data, "usage": use}
    return _response_object(plan, text)


def _sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def _chat_events(emu: Emulator, plan: Plan) -> Iterator[bytes]:
    base = {"id": plan.rid, "object": "chat.completion.chunk", "created": plan.created, "model": plan.model}
    continuous = plan.include_usage and plan.continuous_usage  # vLLM's continuous_usage_stats
    p = plan.prompt_tokens

    def chunk(delta: dict[str, Any], done: int, finish: str | None = None) -> bytes:
        choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        if finish is not None:
            choice["stop_reason"] = None
        obj: dict[str, Any] = {**base, "choices": [choice]}
        if continuous:
            obj["usage"] = usage(p, done)
        return _sse(obj)

    yield chunk({"role": "assistant", "content": ""}, 0)
    for i, piece in enumerate(emu.pieces(plan.max_tokens)):
        yield chunk({"content": piece}, i + 1)
    yield chunk({}, plan.max_tokens, "length")
    if plan.include_usage:  # OpenAI's shape: a last chunk with empty choices carrying the usage
        yield _sse({**base, "choices": [], "usage": usage(p, plan.completion_tokens)})
    yield b"data: [DONE]\n\n"


def _completion_events(emu: Emulator, plan: Plan) -> Iterator[bytes]:
    base = {"id": plan.rid, "object": "text_completion", "created": plan.created, "model": plan.model}
    continuous = plan.include_usage and plan.continuous_usage
    p, done = plan.prompt_tokens, 0
    for index in range(len(plan.prompts)):
        for text, finish in [*((piece, None) for piece in emu.pieces(plan.max_tokens)), ("", "length")]:
            done += finish is None
            choice = {
                "index": index,
                "text": text,
                "logprobs": None,
                "finish_reason": finish,
                "stop_reason": None,
            }
            obj: dict[str, Any] = {**base, "choices": [choice]}
            if continuous:
                obj["usage"] = usage(p, done)
            yield _sse(obj)
    if plan.include_usage:
        yield _sse({**base, "choices": [], "usage": usage(p, plan.completion_tokens)})
    yield b"data: [DONE]\n\n"


def _responses_events(emu: Emulator, plan: Plan) -> Iterator[bytes]:
    """The Responses API event sequence; `response.completed` carries usage.input_tokens. No [DONE]."""
    seq = 0

    def event(kind: str, **fields: Any) -> bytes:
        nonlocal seq
        seq += 1
        data = orjson.dumps({"type": kind, "sequence_number": seq - 1, **fields})
        return b"event: " + kind.encode() + b"\ndata: " + data + b"\n\n"

    text = emu.text(plan.max_tokens)
    item_id = "msg_" + plan.rid[5:]
    where = {"item_id": item_id, "output_index": 0, "content_index": 0}
    yield event("response.created", response=_response_object(plan, None))
    yield event("response.in_progress", response=_response_object(plan, None))
    yield event("response.output_item.added", output_index=0, item=_message_item(plan, "", "in_progress"))
    part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
    yield event("response.content_part.added", **where, part=part)
    for piece in emu.pieces(plan.max_tokens):
        yield event("response.output_text.delta", **where, delta=piece, logprobs=[])
    yield event("response.output_text.done", **where, text=text, logprobs=[])
    yield event("response.content_part.done", **where, part={**part, "text": text})
    yield event("response.output_item.done", output_index=0, item=_message_item(plan, text, "completed"))
    yield event("response.completed", response=_response_object(plan, text))


def stream_events(emu: Emulator, plan: Plan) -> Iterator[bytes]:
    if plan.endpoint == Endpoint.CHAT:
        return _chat_events(emu, plan)
    if plan.endpoint == Endpoint.COMPLETIONS:
        return _completion_events(emu, plan)
    return _responses_events(emu, plan)


# ---------------------------------------------------------------------------------------------------------
# HTTP handlers and the app.


async def _write_stream(request: web.Request, emu: Emulator, plan: Plan) -> web.StreamResponse:
    resp = web.StreamResponse(
        headers={"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
    )
    events: Iterator[bytes] | list[bytes] = stream_events(emu, plan)
    cut_at = -1
    if emu.draw_reset():
        events = list(events)
        cut_at = min(RESET_AFTER_CHUNKS, len(events) - 1)  # always before the stream's natural end
    gap = emu.config.faults.token_latency_seconds
    emu.stats.streams_started += 1
    try:
        await resp.prepare(request)
        for i, chunk in enumerate(events):
            if i == cut_at:
                # Close the connection with the chunked body unfinished: the client sees a truncated
                # stream (aiohttp: ClientPayloadError; httpx: RemoteProtocolError), as when a server dies.
                emu.stats.streams_reset += 1
                if request.transport is not None:
                    request.transport.abort()
                return resp
            if gap and i:
                await asyncio.sleep(gap)
            await resp.write(chunk)  # aiohttp hands each write to the transport at once: chunks stay chunks
        await resp.write_eof()
    except ConnectionResetError:  # the client went away; aiohttp does not cancel the handler by default
        emu.stats.client_disconnects += 1
        return resp
    except asyncio.CancelledError:
        emu.stats.client_disconnects += 1
        raise
    emu.stats.streams_completed += 1
    return resp


def _inference_handler(endpoint: Endpoint) -> Any:
    async def handle(request: web.Request) -> web.StreamResponse:
        emu = request.app[EMULATOR]
        emu.stats.requests += 1
        status = emu.draw_status()  # drawn on arrival, so the sequence depends on request order only
        if emu.config.faults.latency_seconds:
            await asyncio.sleep(emu.config.faults.latency_seconds)
        if status is not None:
            emu.stats.status_faults += 1
            return error_response(f"emulated fault: status {status}", status)
        try:
            plan = emu.plan(endpoint, await request.read())
        except RequestError as exc:
            return error_response(str(exc), exc.status, exc.param)
        if plan.stream:
            return await _write_stream(request, emu, plan)
        return web.Response(body=orjson.dumps(full_body(emu, plan)), content_type="application/json")

    return handle


async def _models(request: web.Request) -> web.Response:
    return web.Response(body=request.app[EMULATOR]._models_body, content_type="application/json")


async def _health(request: web.Request) -> web.Response:
    return web.Response(status=200)  # vLLM: 200 with an empty body


async def _stats(request: web.Request) -> web.Response:
    emu = request.app[EMULATOR]
    body = {**emu.stats.as_dict(), "faults": emu.config.faults.describe()}
    return web.Response(body=orjson.dumps(body), content_type="application/json")


PATHS = {
    "/v1/chat/completions": Endpoint.CHAT,
    "/v1/completions": Endpoint.COMPLETIONS,
    "/v1/embeddings": Endpoint.EMBEDDINGS,
    "/v1/responses": Endpoint.RESPONSES,
}
MAX_BODY_BYTES = 64 * 1024 * 1024  # above the proxy's default limit, so "huge body" tests reach us


def build_emulator_app(
    config: EmulatorConfig, tokenizer: LoadedTokenizer | Any | None = None
) -> web.Application:
    """The emulator as an aiohttp app. `tokenizer` (a LoadedTokenizer or a transformers tokenizer) skips
    loading `config.tokenizer`, so tests share one loaded tokenizer between apps with different faults."""
    if tokenizer is None:
        tokenizer = load_tokenizer(config.tokenizer, chat_template_file=config.chat_template)
    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app[EMULATOR] = Emulator(config, tokenizer)
    for path, endpoint in PATHS.items():
        app.router.add_post(path, _inference_handler(endpoint))
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/health", _health)
    app.router.add_get("/emulator/stats", _stats)
    return app


async def start_emulator(
    config: EmulatorConfig, host: str = "127.0.0.1", port: int = 0, tokenizer: LoadedTokenizer | Any = None
) -> tuple[web.AppRunner, str]:
    """Serve in the running loop; returns the runner (call `await runner.cleanup()`) and the base URL."""
    runner = web.AppRunner(build_emulator_app(config, tokenizer), access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = runner.addresses[0]
    return runner, f"http://{_url_host(host)}:{bound[1]}"


# ---------------------------------------------------------------------------------------------------------
# CLI.


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def parse_listen(text: str) -> tuple[str, int]:
    """`HOST:PORT`, `[V6]:PORT` or `:PORT` (loopback)."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"bad --listen {text!r}: expected HOST:PORT, e.g. 127.0.0.1:8000")
    host = host.strip("[]") or "127.0.0.1"
    return host, int(port)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--tokenizer",
        default=DEFAULT_TOKENIZER,
        help=f"PATH_OR_ID[@REVISION] or builtin:NAME (default {DEFAULT_TOKENIZER})",
    )
    parser.add_argument(
        "--chat-template", metavar="FILE", help="a Jinja file overriding the tokenizer's template"
    )
    parser.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="NAME",
        help="a served model name (repeatable; default: the tokenizer spec, as vLLM does)",
    )
    parser.add_argument(
        "--strict-models",
        action="store_true",
        help="answer 404 for models not served, like vLLM (default: answer any model)",
    )
    parser.add_argument("--listen", default="127.0.0.1:8000", help="HOST:PORT (default 127.0.0.1:8000)")
    parser.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="SPEC",
        help="double-bos | no-template | system-prompt=N | gen-prompt-off | status=CODE@FRACTION"
        " | latency=50ms | token-latency=5ms | reset-mid-stream@FRACTION (repeatable)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the fault RNGs (default 0)")
    parser.add_argument(
        "--default-max-tokens",
        type=int,
        default=DEFAULT_MAX_TOKENS,
        help=f"answer length when the request sets none (default {DEFAULT_MAX_TOKENS})",
    )
    parser.add_argument(
        "--wall-clock",
        action="store_true",
        help="real `created` timestamps (default: a fixed one, for reproducible bytes)",
    )


def config_from_args(args: argparse.Namespace) -> EmulatorConfig:
    """Raises ValueError on a bad fault spec or setting."""
    if args.default_max_tokens < 1:
        raise ValueError("--default-max-tokens must be at least 1")
    return EmulatorConfig(
        tokenizer=args.tokenizer,
        models=tuple(args.model),
        chat_template=args.chat_template,
        faults=parse_faults(args.fault),
        seed=args.seed,
        default_max_tokens=args.default_max_tokens,
        strict_models=args.strict_models,
        created=None if args.wall_clock else FIXED_CREATED,
    )


async def _serve(app: web.Application, host: str, port: int) -> None:
    import signal

    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    emu = app[EMULATOR]
    url = f"http://{_url_host(host)}:{runner.addresses[0][1]}"
    faults = ",".join(emu.config.faults.describe()) or "none"
    log.info("emulating %s on %s (faults: %s)", ",".join(emu.config.served_models), url, faults)
    print(f"islwatch emulate: listening on {url}", flush=True)  # a ready line for scripts and the demo
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def run(args: argparse.Namespace) -> int:
    try:
        config = config_from_args(args)
        host, port = parse_listen(args.listen)
        app = build_emulator_app(config)
    except (ValueError, TokenizerLoadError) as exc:
        print(f"islwatch emulate: error: {exc}", file=sys.stderr)
        return 2
    try:
        import uvloop

        loop_factory = uvloop.new_event_loop
    except ImportError:  # pragma: no cover - uvloop is a dependency except on Windows
        loop_factory = None
    try:
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            runner.run(_serve(app, host, port))
    except OSError as exc:  # address in use, permission denied
        print(f"islwatch emulate: error: cannot listen on {args.listen}: {exc}", file=sys.stderr)
        return 2
    return 0
