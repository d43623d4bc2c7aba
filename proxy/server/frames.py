"""The worker-process pipe protocol: job frames to a worker, outcome lines back. No pickling."""

from __future__ import annotations

import struct
from typing import Any

import orjson

from proxy.core.usage import Usage
from proxy.server.records import AnalysisJob, AnalysisOutcome

# Parent -> worker, one frame per job: `<II` (header length, payload length), an orjson header, then the raw
# payload (request body, then the response bytes to read usage from, if any). No pickling: the body crosses
# as the bytes the client sent. Worker -> parent: one orjson array per line (`OUTCOME` rows, `READY`).
FRAME_HEAD = struct.Struct("<II")
OUTCOME = "o"
READY = "ready"


def encode_job(job: AnalysisJob) -> bytes:
    """One job frame (the body and response bytes are copied once, into the frame)."""
    resp = job.response_json
    # orjson writes the Usage dataclass as an object; decode_job rebuilds it.
    header = orjson.dumps(
        (job.endpoint, job.model_label, job.tokenizer_key, job.server_tokens, job.streamed, len(job.body),
         -1 if resp is None else len(resp), job.server_usage, job.memo_key)
    )  # fmt: skip
    size = len(job.body) + (0 if resp is None else len(resp))
    parts = [FRAME_HEAD.pack(len(header), size), header, job.body]
    if resp:
        parts.append(resp)
    return b"".join(parts)


def decode_job(header: bytes, payload: bytes) -> AnalysisJob:
    head = orjson.loads(header)
    endpoint, model_label, tokenizer_key, server_tokens, streamed, body_len, resp_len, usage, memo_key = head
    resp = None if resp_len < 0 else payload[body_len : body_len + resp_len]
    return AnalysisJob(
        endpoint=endpoint,
        model_label=model_label,
        tokenizer_key=tokenizer_key,
        body=payload[:body_len],
        server_tokens=server_tokens,
        server_usage=Usage(**usage) if usage is not None else None,
        response_json=resp,
        streamed=streamed,
        memo_key=memo_key,
    )


def encode_outcome(o: AnalysisOutcome) -> bytes:
    return orjson.dumps(
        (OUTCOME, o.endpoint, o.model_label, o.seconds, o.bare, o.templated, o.expected, o.server, o.match,
         o.cause, o.fallback_reason, o.bad_reason, o.detail, o.duplicate_bos_risk, o.error, o.output_tokens,
         o.cached_tokens, o.reasoning_tokens, o.error_stage, o.images, o.image_tokens, o.memo_key)
    ) + b"\n"  # fmt: skip


def decode_outcome(row: list[Any]) -> AnalysisOutcome:
    """The inverse of `encode_outcome` for a parsed line whose first element is OUTCOME."""
    return AnalysisOutcome(*row[1:])
