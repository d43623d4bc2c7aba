"""What crosses from the request path to the analysis workers and back: small frozen, picklable records.

Also the two small policies both sides share: which label and tokenizer a model name maps to, and the
one-line problem log (no prompt text, ever; repeated problems are summarised instead of flooding).
"""

from __future__ import annotations

import logging
import struct
import time
from dataclasses import dataclass
from typing import Any

import orjson

# Model label values besides configured model names (bounded cardinality).
DEFAULT_LABEL = "default"  # no --model-tokenizer map: every model is the one served model
OTHER_LABEL = "other"  # a model name the map does not know: many names collapse into this one value
NONE_LABEL = "none"  # a request islwatch does not analyse (other paths, unreadable bodies)
DEFAULT_KEY = ""  # tokenizer key of the default tokenizer (config forbids empty model names)
OTHER_ENDPOINT = "other"


@dataclass(frozen=True)
class ModelRoute:
    label: str
    tokenizer_key: str | None  # None: no tokenizer for this model, count nothing
    unknown: bool  # a name the --model-tokenizer map does not know


def route_model(model: Any, models: frozenset[str], has_default: bool) -> ModelRoute:
    """Label and tokenizer for the request's `model` (see the README, "Models and labels")."""
    if isinstance(model, str) and model in models:
        return ModelRoute(model, model, False)
    default_key = DEFAULT_KEY if has_default else None
    if not models:
        return ModelRoute(DEFAULT_LABEL, default_key, False)
    return ModelRoute(OTHER_LABEL, default_key, True)


@dataclass(frozen=True)
class AnalysisJob:
    """One relayed request to analyse. Raw bytes travel to worker processes (cheaper than pickling a
    parsed body); in thread mode the body the handler already parsed rides along in `parsed`."""

    endpoint: str
    model_label: str
    tokenizer_key: str
    body: bytes
    parsed: Any = None
    server_tokens: int | None = None  # from the SSE parser on the response path
    response_json: bytes | None = None  # a JSON response (or its tail) for the worker to read usage from
    streamed: bool = False  # the response was an event stream


@dataclass(frozen=True)
class AnalysisOutcome:
    """Everything the main process needs to update the metrics for one analysed request."""

    endpoint: str
    model_label: str
    seconds: float
    bare: int | None = None
    templated: int | None = None
    expected: int | None = None
    server: int | None = None
    match: str | None = None  # exact | mismatch | no_server_count | no_template; None: not counted
    cause: str | None = None  # drift cause, when a server count is known
    fallback_reason: str | None = None
    bad_reason: str | None = None  # e.g. not_a_request
    detail: str | None = None  # content-free
    duplicate_bos_risk: bool = False
    error: str | None = None  # the worker could not analyse (no tokenizer loaded, internal error)


# ---- the worker-process pipe protocol ------------------------------------------------------------------------
# Parent -> worker, one frame per job: `<II` (header length, payload length), an orjson header, then the raw
# payload (request body, then the response bytes to read usage from, if any). No pickling: the body crosses
# as the bytes the client sent. Worker -> parent: one orjson array per line (`OUTCOME` rows, `READY`).
FRAME_HEAD = struct.Struct("<II")
OUTCOME = "o"
READY = "ready"


def encode_job(job: AnalysisJob) -> bytes:
    """One job frame (the body and response bytes are copied once, into the frame)."""
    resp = job.response_json
    header = orjson.dumps(
        (job.endpoint, job.model_label, job.tokenizer_key, job.server_tokens, job.streamed, len(job.body),
         -1 if resp is None else len(resp))
    )  # fmt: skip
    size = len(job.body) + (0 if resp is None else len(resp))
    parts = [FRAME_HEAD.pack(len(header), size), header, job.body]
    if resp:
        parts.append(resp)
    return b"".join(parts)


def decode_job(header: bytes, payload: bytes) -> AnalysisJob:
    endpoint, model_label, tokenizer_key, server_tokens, streamed, body_len, resp_len = orjson.loads(header)
    resp = None if resp_len < 0 else payload[body_len : body_len + resp_len]
    return AnalysisJob(
        endpoint=endpoint,
        model_label=model_label,
        tokenizer_key=tokenizer_key,
        body=payload[:body_len],
        server_tokens=server_tokens,
        response_json=resp,
        streamed=streamed,
    )


def encode_outcome(o: AnalysisOutcome) -> bytes:
    return orjson.dumps(
        (OUTCOME, o.endpoint, o.model_label, o.seconds, o.bare, o.templated, o.expected, o.server, o.match,
         o.cause, o.fallback_reason, o.bad_reason, o.detail, o.duplicate_bos_risk, o.error)
    ) + b"\n"  # fmt: skip


def decode_outcome(row: list[Any]) -> AnalysisOutcome:
    """The inverse of `encode_outcome` for a parsed line whose first element is OUTCOME."""
    return AnalysisOutcome(*row[1:])


@dataclass(frozen=True)
class TokenizerReport:
    """Result of loading one tokenizer in a worker: identity for the info metric, the parity self-check."""

    key: str
    label: str
    identity: dict[str, Any] | None
    parity_ok: bool | None  # None: not run (parity module absent)
    parity_summary: str
    error: str | None = None

    def as_row(self) -> list[Any]:
        return [self.key, self.label, self.identity, self.parity_ok, self.parity_summary, self.error]

    @classmethod
    def from_row(cls, row: list[Any]) -> TokenizerReport:
        return cls(*row)


class ProblemLog:
    """One log line per problem, without content; at most one line per reason per `interval` seconds,
    the next line saying how many were not logged, so a flood of bad requests cannot flood the log."""

    def __init__(self, logger: logging.Logger, interval: float = 10.0) -> None:
        self._log = logger
        self._interval = interval
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def __call__(self, reason: str, message: str, *args: Any, level: int = logging.WARNING) -> None:
        now = time.monotonic()
        last = self._last.get(reason)
        if last is not None and now - last < self._interval:
            self._suppressed[reason] = self._suppressed.get(reason, 0) + 1
            return
        self._last[reason] = now
        skipped = self._suppressed.pop(reason, 0)
        suffix = f" ({skipped} more since the last such line)" if skipped else ""
        self._log.log(level, f"{reason}: {message}{suffix}", *args)
