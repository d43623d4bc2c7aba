"""Server-reported usage, read from response bytes. Pure: no aiohttp, no prometheus_client, no I/O.

Where OpenAI-compatible servers put the prompt count:
- JSON responses: `usage.prompt_tokens` (chat, completions, embeddings); `usage.input_tokens` on
  `/v1/responses` (https://platform.openai.com/docs/api-reference/responses/object).
- Streams (SSE): the last non-null `usage` of any event. OpenAI sends `"usage": null` on every chunk and the
  numbers on a final chunk with `"choices": []` when `stream_options.include_usage` is set; vLLM does the same
  without the nulls (and repeats usage on every chunk with `continuous_usage_stats`); llama.cpp puts usage on
  the chunk that carries `finish_reason` for `/v1/completions`; `/v1/responses` streams carry it in the
  `response.completed` event as `response.usage.input_tokens`.

`SSEUsageParser.feed(chunk)` accepts any chunking (it is tested one byte at a time) and only parses lines
that mention `"usage"`, so relaying a stream costs a newline scan per chunk, not a JSON parse per event.
`SSEUsageStripper` undoes what `--inject-stream-usage` added, so the client receives the stream it would
have received without it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import orjson

from .buffers import USAGE_KEY as _USAGE_KEY
from .buffers import LineSplitter

# `"usage": null` as a field of a chunk, with the comma that joins it to its neighbour (either side).
_NULL_USAGE_AFTER = re.compile(rb',\s*"usage"\s*:\s*null')
_NULL_USAGE_BEFORE = re.compile(rb'"usage"\s*:\s*null\s*,?')
_USAGE_OBJECT = re.compile(rb'"usage"\s*:\s*\{')


@dataclass(frozen=True)
class Usage:
    """One response's usage; None where the server did not report the field (never guessed as 0)."""

    input_tokens: int
    output_tokens: int | None = None
    total_tokens: int | None = None
    cached_tokens: int | None = None  # prompt tokens served from the server's prefix cache
    reasoning_tokens: int | None = None  # output tokens spent reasoning


def _int(value: Any) -> int | None:
    # bool is an int subclass; a server sending `true` as a count is not a count.
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def usage_of(obj: Any) -> Usage | None:
    """The usage in one response object or stream event; None when absent or null."""
    if not isinstance(obj, dict):
        return None
    usage = obj.get("usage")
    if usage is None and isinstance(obj.get("response"), dict):  # /v1/responses events
        usage = obj["response"].get("usage")
    if not isinstance(usage, dict):
        return None
    prompt = _int(usage.get("prompt_tokens"))
    if prompt is None:
        prompt = _int(usage.get("input_tokens"))
    if prompt is None:
        return None
    output = _int(usage.get("completion_tokens"))
    if output is None:
        output = _int(usage.get("output_tokens"))
    # Chat/completions name the details `prompt_tokens_details` / `completion_tokens_details`, /v1/responses
    # `input_tokens_details` / `output_tokens_details` (OpenAI API reference, the usage objects).
    cached = _detail(usage, "prompt_tokens_details", "input_tokens_details", "cached_tokens")
    reasoning = _detail(usage, "completion_tokens_details", "output_tokens_details", "reasoning_tokens")
    return Usage(prompt, output, _int(usage.get("total_tokens")), cached, reasoning)


def _detail(usage: dict[str, Any], chat_key: str, responses_key: str, field: str) -> int | None:
    """A count inside a details object; None when the object or the field is absent or null (vLLM sends
    `"completion_tokens_details": null` without a reasoning parser)."""
    for key in (chat_key, responses_key):
        details = usage.get(key)
        if isinstance(details, dict) and (value := _int(details.get(field))) is not None:
            return value
    return None


def _balanced_object(data: bytes, start: int) -> bytes | None:
    """The JSON object starting at data[start] ('{'), found by brace matching outside strings."""
    depth = 0
    in_string = False
    escaped = False
    for i in range(start, len(data)):
        c = data[i]
        if in_string:
            if escaped:
                escaped = False
            elif c == 0x5C:  # backslash
                escaped = True
            elif c == 0x22:
                in_string = False
        elif c == 0x22:
            in_string = True
        elif c == 0x7B:
            depth += 1
        elif c == 0x7D:
            depth -= 1
            if depth == 0:
                return data[start : i + 1]
    return None


def usage_from_json_bytes(data: bytes) -> Usage | None:
    """Usage of a JSON response body, or of the tail of one too large to keep whole.

    A full parse when the bytes are a document; otherwise the last `"usage": {...}` object in the bytes.
    An unescaped `"usage"` can only be a key (inside strings the quotes are escaped), and servers put usage
    near the end of the body (after `choices` / `data`), so the kept tail still holds it.
    """
    try:
        return usage_of(orjson.loads(data))
    except orjson.JSONDecodeError:
        pass
    for match in reversed(list(_USAGE_OBJECT.finditer(data))):
        obj = _balanced_object(data, match.end() - 1)
        if obj is None:
            continue
        try:
            return usage_of({"usage": orjson.loads(obj)})
        except orjson.JSONDecodeError:
            continue
    return None


def _data_payload(line: bytes) -> bytes | None:
    """The value of an SSE `data:` field line (https://html.spec.whatwg.org/#event-stream-interpretation)."""
    if line.endswith(b"\r"):
        line = line[:-1]
    if not line.startswith(b"data:"):
        return None
    payload = line[5:]
    return payload[1:] if payload.startswith(b" ") else payload


def _event_usage(payload: bytes) -> tuple[Usage | None, Any]:
    try:
        obj = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return None, None
    return usage_of(obj), obj


def _finished_choice_index(obj: Any) -> int | None:
    """The index of the one choice an event finishes (llama.cpp puts each prompt's usage there)."""
    choices = obj.get("choices") if isinstance(obj, dict) else None
    if isinstance(choices, list) and len(choices) == 1 and isinstance(choices[0], dict):
        choice = choices[0]
        index = choice.get("index")
        if choice.get("finish_reason") is not None and isinstance(index, int):
            return index
    return None


class SSEUsageParser:
    """Feed SSE bytes in any chunking; `result()` is the request's usage.

    That is the last non-null usage seen, except for llama.cpp's `/v1/completions` stream of several prompts:
    there each prompt's usage rides on its own finish chunk (choice index = prompt index) and no total chunk
    follows, so the request's usage is their sum. A `"choices": []` total chunk (OpenAI, vLLM) still wins.
    """

    def __init__(self) -> None:
        self._lines = LineSplitter()  # an over-long line (no usage event is) is skipped, never held
        self._usage: Usage | None = None
        self._final: Usage | None = None
        self._per_choice: dict[int, Usage] = {}

    def feed(self, chunk: bytes) -> None:
        if _USAGE_KEY not in chunk and self._lines.at_line_start:
            # Most chunks: no complete line of it can hold usage, only its unfinished last one may (the key
            # can straddle into the next chunk). Just that is kept, without splitting the rest into lines.
            chunk = chunk[chunk.rfind(b"\n") + 1 :]
            if not chunk:
                return
        for line in self._lines.split(chunk)[1]:
            self._line(line)

    def _line(self, line: bytes) -> None:
        if _USAGE_KEY not in line:
            return
        payload = _data_payload(line)
        if payload is None:
            return
        if line.count(_USAGE_KEY) == 1 and _NULL_USAGE_BEFORE.search(line):
            return  # OpenAI's `"usage": null` on an ordinary chunk: nothing to parse
        usage, obj = _event_usage(payload)
        if usage is None:
            return
        self._usage = usage
        if is_usage_only_chunk(obj):
            self._final = usage
        elif (index := _finished_choice_index(obj)) is not None:
            self._per_choice[index] = usage

    def result(self) -> Usage | None:
        if rest := self._lines.rest():  # a last event without its newline: servers do end streams that way
            self._line(rest)
        if self._final is None and len(self._per_choice) > 1:
            return summed(list(self._per_choice.values()))
        return self._usage


def summed(parts: list[Usage]) -> Usage:
    """The usage of several prompts' parts: each field summed, None where any part lacks it."""

    def total(values: list[int | None]) -> int | None:
        return None if None in values else sum(v for v in values if v is not None)

    return Usage(
        sum(u.input_tokens for u in parts),
        total([u.output_tokens for u in parts]),
        cached_tokens=total([u.cached_tokens for u in parts]),
        reasoning_tokens=total([u.reasoning_tokens for u in parts]),
    )


def is_usage_only_chunk(obj: Any) -> bool:
    """The extra chunk `include_usage` adds: `"choices": []` plus usage (OpenAI, vLLM, llama.cpp chat)."""
    return isinstance(obj, dict) and obj.get("choices") == [] and usage_of(obj) is not None


class SSEUsageStripper:
    """Turns a stream requested with an injected `stream_options.include_usage` back into the original.

    Two things differ from the stream the client would have received: the usage-only final chunk (dropped
    with the blank line that ends its event) and `"usage": null` on every other chunk (OpenAI adds it when
    include_usage is set; removed byte-wise so the rest of the line stays byte-identical). Usage on a chunk
    that has choices is left alone: llama.cpp's completions finish chunk carries it with or without the
    option. Works on whole lines, so a line is held back only until its newline arrives, and at most
    `MAX_LINE_BYTES` of it (buffers.py): a longer line is passed on unchanged as its bytes arrive.
    """

    def __init__(self, parser: SSEUsageParser) -> None:
        self._parser = parser
        self._lines = LineSplitter()
        self._drop_blank = False

    @property
    def held(self) -> int:
        """Bytes received and not yet passed on (at most one line's worth, `MAX_LINE_BYTES`)."""
        return self._lines.held

    def feed(self, chunk: bytes) -> bytes:
        self._parser.feed(chunk)
        head, lines, tail = self._lines.split(chunk)
        out = [head] if head else []
        for line in lines:
            kept = self._line(line)
            if kept is not None:
                out.append(kept + b"\n")
        if tail:  # the start of an over-long line: not an event to strip, never held hostage
            self._drop_blank = False
            out.append(tail)
        return b"".join(out)

    def flush(self) -> bytes:
        rest = self._lines.rest()
        line = self._line(rest) if rest else None
        return line or b""

    def _line(self, line: bytes) -> bytes | None:
        if self._drop_blank:
            self._drop_blank = False
            if line in (b"", b"\r"):
                return None
        if _USAGE_KEY not in line:
            return line
        payload = _data_payload(line)
        if payload is None:
            return line
        _, obj = _event_usage(payload)
        if is_usage_only_chunk(obj):
            self._drop_blank = True
            return None
        stripped, n = _NULL_USAGE_AFTER.subn(b"", line, count=1)
        if n:
            return stripped
        return _NULL_USAGE_BEFORE.sub(b"", line, count=1)
