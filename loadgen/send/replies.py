"""What one request came to: the server's answer read into reply text, timings and usage, and its record.

Pure (no aiohttp, no I/O). Token counts are read by proxy.core.usage, the parser the proxy itself uses, so
the loadgen and the proxy accept the same numbers: a boolean or a negative count is no count, the
responses API's `input_tokens` is understood, and so is the Messages API's (its cache reads added back: the
prompt the server processed). The reply text and the content-chunk times are the loadgen's
own: the text is the next turn's history, the times are TTFT and inter-token latency.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from loadgen.workload.anthropic import reply_text, text_delta
from proxy.core.usage import SSEUsageParser, Usage, usage_of


@dataclass(frozen=True)
class Record:
    """One request's outcome: one line of --records."""

    conversation: str
    turn: int
    warmup: bool
    turn_isl: int
    target_isl: int
    client_isl: int | None
    server_prompt_tokens: int | None
    reply_tokens: int
    output_tokens: int | None
    status: int | None
    error: str | None  # transport or HTTP error
    budget_error: str | None  # the request could not be budgeted exactly
    sent_at: float  # time.monotonic(), comparable across worker processes on one machine
    scheduled_at: float | None  # open loop: when the schedule said to send
    send_lateness_ms: float | None
    latency_ms: float | None  # end to end
    ttft_ms: float | None
    itl_ms: float | None  # mean gap between content chunks
    cached_prompt_tokens: int | None = None  # usage: prompt tokens served from the server's prefix cache


@dataclass(frozen=True)
class Outcome:
    status: int | None
    error: str | None
    reply: str | None
    prompt_tokens: int | None
    output_tokens: int | None
    latency_ms: float | None
    ttft_ms: float | None
    itl_ms: float | None
    cached_tokens: int | None = None  # None: the server's usage did not report it


def failed(error: str, status: int | None = None, latency_ms: float | None = None) -> Outcome:
    """An answer without a usable body: a transport error, an HTTP error, a request never sent."""
    return Outcome(status, error, None, None, None, latency_ms, None, None)


def _text_of(choice: dict[str, Any], streaming: bool) -> str:
    if streaming:
        delta = choice.get("delta") or {}
        return delta.get("content") or choice.get("text") or ""
    message = choice.get("message") or {}
    return message.get("content") or choice.get("text") or ""


def _event(line: bytes) -> dict[str, Any] | None:
    """The JSON object of one SSE `data:` line, or None (comments, `[DONE]`, anything not an object)."""
    line = line.strip()
    if not line.startswith(b"data:"):
        return None
    payload = line[5:].strip()
    if payload == b"[DONE]" or not payload:
        return None
    try:
        obj = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) else None


class StreamTimer:
    """Feeds SSE lines; keeps the reply text and content-chunk times. `usage()` is the stream's usage."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.times: list[float] = []
        self._usage = SSEUsageParser()

    def feed_line(self, line: bytes, now: float) -> None:
        self._usage.feed(line)
        obj = _event(line)
        if obj is None:
            return
        if obj.get("type") == "response.output_text.delta":  # a /v1/responses stream's text
            delta = obj.get("delta")
            if isinstance(delta, str) and delta:
                self.parts.append(delta)
                self.times.append(now)
            return
        if delta := text_delta(obj):  # a /v1/messages stream's text
            self.parts.append(delta)
            self.times.append(now)
            return
        for choice in obj.get("choices") or []:
            text = _text_of(choice, True) if isinstance(choice, dict) else ""
            if text:
                self.parts.append(text)
                self.times.append(now)

    @property
    def reply(self) -> str:
        return "".join(self.parts)

    def usage(self) -> Usage | None:
        return self._usage.result()

    def outcome(self, start: float, end: float) -> Outcome:
        """The streamed answer that began at `start` and ended at `end` (perf_counter seconds)."""
        usage = self.usage()
        output = usage.output_tokens if usage is not None else None
        gaps = [b - a for a, b in zip(self.times, self.times[1:], strict=False)]
        return Outcome(
            200,
            None,
            self.reply,
            usage.input_tokens if usage is not None else None,
            output if output is not None else len(self.times),
            (end - start) * 1000,
            (self.times[0] - start) * 1000 if self.times else None,
            (sum(gaps) / len(gaps)) * 1000 if gaps else None,
            usage.cached_tokens if usage is not None else None,
        )


def _output_text(obj: dict[str, Any]) -> str:
    """A /v1/responses object's text: its message items' `output_text` parts, in order."""
    texts = []
    for item in obj.get("output") or []:
        if isinstance(item, dict) and item.get("type") == "message":
            for part in item.get("content") or []:
                if isinstance(part, dict) and part.get("type") == "output_text":
                    texts.append(str(part.get("text") or ""))
    return "".join(texts)


def json_outcome(status: int, raw: bytes, latency_ms: float) -> Outcome:
    """A whole (non-streamed) answer."""
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        obj = None
    if status != 200 or not isinstance(obj, dict):
        return failed(f"HTTP {status}", status, latency_ms)
    usage = usage_of(obj)
    choices = obj.get("choices") or []
    if choices and isinstance(choices[0], dict):
        reply = _text_of(choices[0], False)
    elif obj.get("type") == "message":  # a /v1/messages answer
        reply = reply_text(obj)
    else:
        reply = _output_text(obj)
    return Outcome(
        200,
        None,
        reply,
        usage.input_tokens if usage is not None else None,
        usage.output_tokens if usage is not None else None,
        latency_ms,
        None,
        None,
        usage.cached_tokens if usage is not None else None,
    )
