"""The request side of the data path: read the body (bounded), note the model and the stream flag, decide
whether the request will be analysed and what goes upstream. Nothing here tokenizes; a problem with the
request only costs its analysis (counted in `islwatch_bad_requests_total`, logged in one throttled line).
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from proxy.core.endpoints import SHAPES, Endpoint, endpoint_of
from proxy.server.guard import body_chunks, body_if_arrived
from proxy.server.metrics import Metrics
from proxy.server.problems import ProblemLog
from proxy.server.records import NONE_LABEL, OTHER_ENDPOINT, route_model


@dataclass(frozen=True)
class Policy:
    """The handler's settings, built once by `app.build_apps`."""

    models: frozenset[str]
    has_default_tokenizer: bool
    max_body_bytes: int
    inject_stream_usage: bool
    body_timeout: float = 60.0  # longest wait for the next body bytes (guard.body_chunks)
    sample_rate: float = 1.0  # --analysis-sample-rate
    # Bernoulli sampling, not a stride: a stride (every k-th request) aliases with periodic traffic (a client
    # alternating two prompts at rate 0.5 would only ever have one analysed), while an independent draw per
    # request keeps every analysed-among-analysed ratio unbiased whatever the traffic's order. Seedable
    # (Policy(rng=random.Random(seed))); the proxy seeds it from the OS.
    rng: random.Random = field(default_factory=random.Random, repr=False, compare=False)

    def sampled(self) -> bool:
        return self.sample_rate >= 1.0 or self.rng.random() < self.sample_rate


@dataclass(frozen=True)
class Inspected:
    endpoint: Endpoint | None  # None: a path or method islwatch only relays
    data: Any  # what goes upstream: the body bytes, a stream, or the body asking for usage
    body: bytes = b""
    parsed: dict[str, Any] | None = None
    model_label: str = NONE_LABEL
    tokenizer_key: str | None = None  # None: not analysed
    injected: bool = False  # stream_options.include_usage was added; the answer is stripped of it again
    skipped: bool = False  # analysable, but the sample rate left it out: relayed only, nothing tapped
    # Sent upstream with `Accept-Encoding: identity` in place of the client's field (`identity_upstream`).
    identity_upstream: bool = False

    @property
    def endpoint_label(self) -> str:
        return self.endpoint or OTHER_ENDPOINT


async def read_limited(body: AsyncIterator[bytes], limit: int) -> tuple[bytes, bool]:
    """Read the body up to `limit` bytes: (bytes read, True if that is the whole body)."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in body:
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            return b"".join(chunks), False
    return b"".join(chunks), True


async def _chain(prefix: bytes, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    yield prefix
    async for chunk in rest:
        yield chunk


def parse_body(body: bytes) -> tuple[Any, str | None]:
    """Parse the request body: (object, None) or (None, reason). The request path's only JSON parse."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        try:
            body.decode("utf-8")
        except UnicodeDecodeError:
            return None, "non_utf8"
        return None, "invalid_json"
    return (obj, None) if isinstance(obj, dict) else (None, "not_a_request")


def json_content_type(ctype: str | None) -> bool:
    # As FastAPI (vLLM, SGLang) decides whether to parse a body as JSON: absent, application/json or +json.
    if not ctype:
        return True
    main = ctype.split(";", 1)[0].strip().lower()
    return main == "application/json" or (main.startswith("application/") and main.endswith("+json"))


def wants_usage(obj: dict[str, Any]) -> bool:
    """A streaming request that did not ask for usage (whether it may be asked: `injection_refused`)."""
    opts = obj.get("stream_options")
    return obj.get("stream") is True and not (isinstance(opts, dict) and opts.get("include_usage") is True)


def injection_refused(obj: dict[str, Any], accept_encoding: str | None) -> str | None:
    """Why asking this request's usage upstream would change what its client receives (an
    INJECTION_RESULTS skip reason), or None when the stripper can undo it.

    - The body already holds `stream_options` (include_usage false, null, or with other keys such as vLLM's
      continuous_usage_stats): turning it on could change every chunk, and rewriting a member in place is
      not worth the risk to the client's bytes.
    - The client accepts only compressed answers (`identity;q=0`, or `*;q=0` with no identity entry, beside
      a coding it accepts): the stripper edits only an uncompressed stream, and re-encoding it would send
      other bytes. A client that accepts compression and identity (the OpenAI SDK's httpx sends
      `gzip, deflate`) is asked usage for: `identity_upstream` has the request go with
      `Accept-Encoding: identity`, so the server sends an uncompressed stream the client declared acceptable
      (RFC 9110 12.5.3), its content unchanged but for the stripped event. A server that compresses anyway
      is relayed as sent and counted (`UsageTap.injection_result`: compressed)."""
    if "stream_options" in obj:
        return "skipped_options"
    if accepts_compression(accept_encoding) and not accepts_identity(accept_encoding):
        return "skipped_encoding"
    return None


def identity_upstream(accept_encoding: str | None) -> bool:
    """Whether an injected request goes upstream with `Accept-Encoding: identity` in place of the client's
    field: when that field lets the server compress. An absent field allows any coding (RFC 9110 12.5.3),
    and servers differ on it (Starlette's GZipMiddleware, in vLLM and SGLang, does not compress then), so it
    is made explicit too. A field that already rules out compression goes as sent."""
    return accept_encoding is None or accepts_compression(accept_encoding)


def _weights(accept_encoding: str | None) -> dict[str, bool]:
    """Each coding the Accept-Encoding field lists, lower case: whether its weight is above zero (RFC 9110
    12.4.2: `q=0` means not acceptable; the last entry for a coding wins)."""
    weights: dict[str, bool] = {}
    for item in (accept_encoding or "").split(","):
        coding, *params = item.split(";")
        coding = coding.strip().lower()
        if not coding:
            continue
        weights[coding] = True
        for param in params:
            name, _, weight = param.strip().lower().partition("=")
            if name.strip() == "q":
                weights[coding] = weight.strip().rstrip("0").rstrip(".") not in ("0", "")
    return weights


def accepts_compression(accept_encoding: str | None) -> bool:
    """The Accept-Encoding field lists a coding other than identity with a non-zero weight (RFC 9110 12.5.3)."""
    return any(ok for coding, ok in _weights(accept_encoding).items() if coding != "identity")


def accepts_identity(accept_encoding: str | None) -> bool:
    """An uncompressed answer is acceptable: unless the field holds `identity;q=0`, or `*;q=0` without an
    entry for identity (RFC 9110 12.5.3)."""
    weights = _weights(accept_encoding)
    return weights.get("identity", weights.get("*", True))


def with_stream_usage(body: bytes) -> bytes:
    """`body` asking for usage: `"stream_options":{"include_usage":true}` added as the last member of its
    root object, every other byte as the client sent it (numbers beyond 64 bits, duplicate or escaped keys,
    whitespace: a re-serialised object would change them). `body` is a JSON object with members (orjson
    parsed it and `stream` is one), so its last byte that is not JSON whitespace is the root's `}`."""
    end = len(body.rstrip(b" \t\r\n")) - 1
    return body[:end] + b',"stream_options":{"include_usage":true}' + body[end:]


async def inspect(request: web.Request, policy: Policy, metrics: Metrics, problems: ProblemLog) -> Inspected:
    endpoint = endpoint_of(request.method, request.path)
    if not request.body_exists:
        return Inspected(endpoint, None)
    # A body of known, bounded length is read whole even for a path islwatch only relays, so that a request
    # lost on a stale pooled connection can be sent again (pooled.retryable needs bytes).
    body, complete = body_if_arrived(request, policy.max_body_bytes), True
    if body is None:
        chunks = body_chunks(request, policy.body_timeout, metrics, problems)
        bounded = request.content_length is not None and request.content_length <= policy.max_body_bytes
        if endpoint is None and not bounded:
            return Inspected(endpoint, chunks)  # any other body streams through
        body, complete = await read_limited(chunks, policy.max_body_bytes)
    if endpoint is None:
        return Inspected(endpoint, body)
    if not complete:
        metrics.bad_request("body_too_large")
        problems(
            "body_too_large",
            "%s body above max_body_bytes=%d: relayed, not analysed",
            endpoint,
            policy.max_body_bytes,
        )
        return Inspected(endpoint, _chain(body, chunks))
    reason: str | None = "wrong_content_type"
    parsed: Any = None
    if json_content_type(request.headers.get("Content-Type")):
        parsed, reason = parse_body(body)
    if reason is not None:
        metrics.bad_request(reason)
        problems(reason, "%s request not analysed (%d bytes)", endpoint, len(body))
        return Inspected(endpoint, body, body)
    # None only when the field is absent: an empty one means identity (RFC 9110 12.5.3) and goes as sent.
    fields = request.headers.getall("Accept-Encoding", None)
    accept_encoding = None if fields is None else ",".join(fields)
    return _routed(endpoint, body, parsed, policy, metrics, problems, accept_encoding)


def _routed(
    endpoint: Endpoint,
    body: bytes,
    parsed: dict[str, Any],
    policy: Policy,
    metrics: Metrics,
    problems: ProblemLog,
    accept_encoding: str | None = None,
) -> Inspected:
    route = route_model(parsed.get("model"), policy.models, policy.has_default_tokenizer)
    if route.unknown:
        metrics.bad_request("unknown_model")
        problems("unknown_model", "a model not in --model-tokenizer: counted as %r", route.label)
    key = route.tokenizer_key
    skipped = key is not None and not policy.sampled()
    if skipped:  # no tap and no usage injection either: a skipped request costs the relay only
        key = None
    data: bytes = body
    injected = False
    if (
        policy.inject_stream_usage
        and key is not None
        and SHAPES[endpoint].include_usage
        and wants_usage(parsed)
    ):
        refused = injection_refused(parsed, accept_encoding)
        if refused is not None:  # relayed as sent: this stream has no server usage
            metrics.injection(refused)
        else:  # ask for usage upstream, uncompressed; the tap takes it out of the client's stream again
            data, injected = with_stream_usage(body), True
    identity = injected and identity_upstream(accept_encoding)
    return Inspected(
        endpoint, data, body, parsed, route.label, key, injected, skipped, identity_upstream=identity
    )
