"""Server-reported usage, read from response bytes. Pure: no aiohttp, no prometheus_client, no I/O.

Where OpenAI-compatible servers put the prompt count:
- JSON responses: `usage.prompt_tokens` (chat, completions, embeddings); `usage.input_tokens` on
  `/v1/responses` (https://platform.openai.com/docs/api-reference/responses/object).
- Streams (SSE): the last non-null `usage` of any event. OpenAI sends `"usage": null` on every chunk and the
  numbers on a final chunk with `"choices": []` when `stream_options.include_usage` is set; vLLM does the same
  without the nulls (and repeats usage on every chunk with `continuous_usage_stats`); llama.cpp puts usage on
  the chunk that carries `finish_reason` for `/v1/completions`; `/v1/responses` streams carry it in the
  `response.completed` event as `response.usage.input_tokens`.
- The Anthropic Messages API (vLLM, SGLang, llama-server): `usage.input_tokens` is the prompt *without* the
  tokens read from or written to the prefix cache (`cache_read_input_tokens`, `cache_creation_input_tokens`:
  https://docs.anthropic.com/en/api/messages, vLLM's anthropic/serving.py `_build_anthropic_usage`), so the
  prompt is their sum. A stream carries it in `message_start` (`message.usage`), the output count in
  `message_delta` (vLLM repeats the input there). `count_tokens` answers `{"input_tokens": N}`: the prompt.
  An input count of 0 is no count (a server that had no usage yet writes 0).

`SSEUsageParser.feed(chunk)` accepts any chunking (it is tested one byte at a time), reads events with the
one SSE reader (core/sse.py) and only parses the data of events that mention `"usage"`; only those events
are cut into lines, the whole events around them (a chunk may hold a fast server's whole stream) cost a few
C-speed scans. `SSEUsageStripper` reads the same way and takes out the usage-only
event `--inject-stream-usage` asked for, so the client receives the stream it would have without it.
A JSON answer's usage is its top-level `usage` member (`usage_from_json_bytes`, core/buffers.py for big
answers).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

import orjson

from .sse import EVENT_ENDS, MAX_LINE_BYTES, USAGE_KEY, Event, LineReader, events_end, first_events_end

_NULL_USAGE = re.compile(rb'"usage"\s*:\s*null')


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
    if usage is None and isinstance(obj.get("message"), dict):  # Anthropic's message_start event
        usage = obj["message"].get("usage")
    if usage is None and "input_tokens" in obj:  # Anthropic's count_tokens answer: the count is top-level
        usage = obj
    if not isinstance(usage, dict):
        return None
    prompt = _int(usage.get("prompt_tokens"))
    cache_read = _int(usage.get("cache_read_input_tokens"))
    if prompt is None and (prompt := _int(usage.get("input_tokens"))) is not None:
        # Anthropic's input_tokens leaves out the cached part of the prompt (module docstring): added back.
        prompt += (cache_read or 0) + (_int(usage.get("cache_creation_input_tokens")) or 0)
        # No prompt has 0 tokens: a 0 is a count the server did not have. SGLang's message_start says 0 when
        # no chunk with usage came before it (anthropic/serving.py `_anthropic_input_tokens` of a None usage),
        # vLLM's `_build_anthropic_usage(None)` too. Not a count: a later event's, or no_server_count.
        prompt = prompt or None
    if prompt is None:
        return None
    output = _int(usage.get("completion_tokens"))
    if output is None:
        output = _int(usage.get("output_tokens"))
    # Chat/completions name the details `prompt_tokens_details` / `completion_tokens_details`, /v1/responses
    # `input_tokens_details` / `output_tokens_details` (OpenAI API reference, the usage objects).
    cached = _detail(usage, "prompt_tokens_details", "input_tokens_details", "cached_tokens")
    cached = cache_read if cached is None else cached
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


def usage_from_json_bytes(data: bytes) -> Usage | None:
    """Usage of a JSON answer: its top-level `usage` member, never one nested deeper (a gateway's trace
    block, a tool result). `data` is the whole answer, or what `JSONUsageWindow` kept of a big one (a
    document holding only its top-level usage); anything that does not parse has no usage."""
    if not isinstance(data, bytes):  # orjson reports a wrong type as a decode error: it is a bug, not data
        raise TypeError(f"usage_from_json_bytes takes bytes, not {type(data).__name__}")
    try:
        return usage_of(orjson.loads(data))
    except orjson.JSONDecodeError:
        return None


def _event_usage(data: bytes) -> tuple[Usage | None, Any]:
    try:
        obj = orjson.loads(data)
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


def _delta_output_tokens(obj: Any) -> int | None:
    """The output count of an Anthropic `message_delta` whose usage has no input count (SGLang, llama.cpp):
    the input count stays the `message_start`'s."""
    if (
        not isinstance(obj, dict)
        or obj.get("type") != "message_delta"
        or not isinstance(obj.get("usage"), dict)
    ):
        return None
    return _int(obj["usage"].get("output_tokens"))


class UsageTally:
    """The usage of a stream, from the data of its events that mention usage.

    That is the last non-null usage seen, except for llama.cpp's `/v1/completions` stream of several prompts:
    there each prompt's usage rides on its own finish chunk (choice index = prompt index) and no total chunk
    follows, so the request's usage is their sum. A `"choices": []` total chunk (OpenAI, vLLM) still wins.
    """

    __slots__ = ("_final", "_per_choice", "_usage")

    def __init__(self) -> None:
        self._usage: Usage | None = None
        self._final: Usage | None = None
        self._per_choice: dict[int, Usage] = {}

    def event(self, data: bytes) -> bool:
        """Read one event's data; True when it is a usage-only chunk (what include_usage adds)."""
        if data.count(USAGE_KEY) == 1 and _NULL_USAGE.search(data):
            return False  # OpenAI's `"usage": null` on an ordinary chunk: nothing to parse
        usage, obj = _event_usage(data)
        if usage is None:
            if self._usage is not None and (output := _delta_output_tokens(obj)) is not None:
                self._usage = replace(self._usage, output_tokens=output)
            return False
        self._usage = usage
        if is_usage_only_chunk(obj):
            self._final = usage
            return True
        if (index := _finished_choice_index(obj)) is not None:
            self._per_choice[index] = usage
        return False

    def result(self) -> Usage | None:
        if self._final is None and len(self._per_choice) > 1:
            return summed(list(self._per_choice.values()))
        return self._usage


class SSEUsageParser:
    """Feed SSE bytes in any chunking (core/sse.py reads them); `result()` is the stream's usage."""

    def __init__(self) -> None:
        self._lines = LineReader()
        self._event = Event()
        self._tally = UsageTally()

    def feed(self, chunk: bytes) -> None:
        # Only the events that hold the key are read line by line: a chunk of several events (a fast server's
        # whole stream arrives in one or two) has the events before and after each passed over by scans.
        while (key := chunk.find(USAGE_KEY)) >= 0:
            if start := events_end(chunk[:key]):  # whole events before the one the key is in
                self._pass(chunk[:start])
                chunk, key = chunk[start:], key - start
            end = first_events_end(chunk[key:])  # the key's event ends after the key (no line end in it)
            if not end:
                return self._read(chunk)
            self._read(chunk[: key + end])
            chunk = chunk[key + end :]
        return self._pass(chunk) if chunk else None

    def _pass(self, chunk: bytes) -> None:
        """Read a chunk without the key: an event begun in an earlier chunk, up to its blank line, and one
        begun at the end of this chunk are read line by line, the whole events between are passed over."""
        at_event_start = self._lines.at_line_start and not self._event.pending
        if at_event_start and chunk.endswith(EVENT_ENDS):  # the commonest: one or more whole events
            self._lines.skip(chunk, len(chunk))
            return None
        if not at_event_start:
            first = first_events_end(chunk)
            if not first:
                return self._read(chunk)
            self._read(chunk[:first])
            chunk = chunk[first:]
        if end := events_end(chunk):
            self._lines.skip(chunk, end)
            chunk = chunk[end:]
        return self._read(chunk) if chunk else None

    def _read(self, chunk: bytes) -> None:
        _, lines, tail = self._lines.split(chunk)
        for raw in lines:
            self._line(raw)
        if tail:
            self._event.overlong()

    def _line(self, raw: bytes) -> None:
        if self._event.line(raw) and (data := self._event.take()) is not None:
            self._tally.event(data)

    def result(self) -> Usage | None:
        if rest := self._lines.rest():  # a last line without its line end: servers do end streams that way
            self._line(rest)
        if (data := self._event.take()) is not None:  # and a last event without its blank line
            self._tally.event(data)
        return self._tally.result()


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
    """Takes out of a stream the usage-only event that `--inject-stream-usage` asked for, and reads its usage.

    Each event's lines are held until the blank line that ends it (a client dispatches an event only then, so
    no event is delayed) and at most `MAX_LINE_BYTES` of them: a longer event is passed on as it comes. An
    event whose data is a usage-only chunk (`"choices": []` and usage: the chunk include_usage adds,
    https://platform.openai.com/docs/api-reference/chat/create#chat-create-stream_options) is dropped whole,
    with its `event:`, `id:`, comment lines and line ends; every other byte passes unchanged. A comment
    outside an event (a keep-alive) is never held.

    `"usage": null` on the other chunks is left as sent: OpenAI adds it when include_usage is set, but servers
    that serialise the SDK's chunk objects send it on every chunk unasked, and the two cannot be told apart.
    Usage on a chunk that has choices is left too: llama.cpp's completions finish chunk carries it with or
    without the option.
    """

    def __init__(self) -> None:
        self._lines = LineReader()
        self._event = Event()
        self._tally = UsageTally()
        self._held: list[bytes] = []
        self._held_bytes = 0
        self._passing = False  # the event went over the hold limit: the rest of it passes as it comes
        self._dropped = False  # the last line end was dropped: the LF completing its CRLF goes too
        self.stripped = 0  # usage-only events taken out

    @property
    def held(self) -> int:
        """Bytes received and not yet passed on (at most about `MAX_LINE_BYTES`)."""
        return self._held_bytes + self._lines.held

    def result(self) -> Usage | None:
        return self._tally.result()

    def feed(self, chunk: bytes) -> bytes:
        out: list[bytes] = []
        if self._passing:
            self._read(chunk, out)
            return b"".join(out)
        # As the parser: only the events that hold the key are read line by line (and held until their end);
        # the whole events before and after each pass on as they are.
        while (key := chunk.find(USAGE_KEY)) >= 0:
            if start := events_end(chunk[:key]):  # whole events before the one the key is in
                self._pass(chunk[:start], out)
                chunk, key = chunk[start:], key - start
            end = first_events_end(chunk[key:])  # the key's event ends after the key (no line end in it)
            if not end:
                break
            self._read(chunk[: key + end], out)
            chunk = chunk[key + end :]
            if self._passing:  # an over-long line began: the rest of its event passes as it comes
                break
        else:
            if chunk:
                self._pass(chunk, out)
            return b"".join(out)  # one piece (a chunk of whole events) is returned as it is, not copied
        if chunk:
            self._read(chunk, out)
        return b"".join(out)

    def _pass(self, chunk: bytes, out: list[bytes]) -> None:
        """Feed a chunk without the key: whole events pass on as they are, without being split into lines
        (an event begun in an earlier chunk and one begun at the end of this one are read line by line)."""
        if self._held or self._dropped or self._event.pending or not self._lines.at_line_start:
            first = first_events_end(chunk)
            if not first:
                self._read(chunk, out)
                return
            self._read(chunk[:first], out)
            chunk = chunk[first:]
        if not self._dropped and (end := events_end(chunk)):
            self._lines.skip(chunk, end)
            out.append(chunk[:end] if end < len(chunk) else chunk)
            chunk = chunk[end:]
        if chunk:
            self._read(chunk, out)

    def _read(self, chunk: bytes, out: list[bytes]) -> None:
        """Read `chunk` line by line, adding to `out` what passes on."""
        head, lines, tail = self._lines.split(chunk)
        if head:
            if self._held:
                self._hold(head, out)
            elif not self._dropped:
                out.append(head)
        self._dropped = False
        for raw in lines:
            self._line(raw, out)
        if tail:  # an over-long line starts: never held, and its event is not one to drop
            self._event.overlong()
            self._release(out)
            self._passing = True
            out.append(tail)

    def flush(self) -> bytes:
        """The end of the stream: a last line and event without their line ends are read as ended."""
        out: list[bytes] = []
        if rest := self._lines.rest():
            self._line(rest, out)
        if self._event.pending or self._held:
            self._end(out)
        return b"".join(out)

    def _line(self, raw: bytes, out: list[bytes]) -> None:
        self._dropped = False
        ended = self._event.line(raw)
        if self._passing:
            out.append(raw)
            if ended:
                self._passing = False
                self._event.take()
        elif ended:
            self._held.append(raw)
            self._end(out)
        elif not self._held and raw[:1] == b":":
            out.append(raw)  # a comment outside any event (a keep-alive): not part of an event to drop
        else:
            self._hold(raw, out)

    def _hold(self, raw: bytes, out: list[bytes]) -> None:
        self._held.append(raw)
        self._held_bytes += len(raw)
        if self._held_bytes > MAX_LINE_BYTES:  # not a usage chunk (a few hundred bytes): pass it on
            self._event.overlong()
            self._release(out)
            self._passing = True

    def _end(self, out: list[bytes]) -> None:
        data = self._event.take()
        if data is not None and self._tally.event(data):
            self._held.clear()
            self._held_bytes = 0
            self._dropped = True
            self.stripped += 1
        else:
            self._release(out)

    def _release(self, out: list[bytes]) -> None:
        out.extend(self._held)
        self._held.clear()
        self._held_bytes = 0
