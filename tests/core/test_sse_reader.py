"""The one SSE reader (core/sse.py) under the usage parser and the stripper, on every framing WHATWG allows.

Each stream is fed whole, one byte at a time and in random splits (every chunk boundary a relay may see):
the parser reads the same usage, and the stripper gives back exactly the stream without the usage-only event,
releasing each event no later than the blank line that ends it (a client dispatches it only then).
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator

import orjson
import pytest

from proxy.core.sse import LineReader
from proxy.core.usage import SSEUsageParser, SSEUsageStripper, Usage, is_usage_only_chunk
from tests.server.helpers import load_recorded, recorded_fixtures

USAGE = {"prompt_tokens": 12, "completion_tokens": 2, "total_tokens": 14}
BASE = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}


def _chunk(content: str, finish: str | None = None, null_usage: bool = False) -> bytes:
    obj: dict[str, object] = {
        **BASE,
        "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": finish}],
    }
    if null_usage:
        obj["usage"] = None
    return orjson.dumps(obj)


FINAL = orjson.dumps({**BASE, "choices": [], "usage": USAGE})


def _events(nl: bytes, final: bool, null_usage: bool = False, extras: bool = False) -> list[bytes]:
    """An OpenAI-shaped chat stream with line end `nl`; `extras`: comment, event:, id: and retry: lines
    (also in the usage event) and one event whose JSON is split over two data lines."""
    events = []
    for i, piece in enumerate(["Hel", "lo", "!"]):
        lines = []
        if extras:
            lines += [b": tick", b"event: chunk", b"id: %d" % i]
        data = _chunk(piece, "stop" if i == 2 else None, null_usage)
        if extras and i == 1:
            cut = data.index(b',"choices"')
            lines += [b"data: " + data[:cut], b"data:" + data[cut:]]  # joined by LF: still one JSON text
        else:
            lines.append(b"data: " + data)
        events.append(nl.join(lines) + nl + nl)
    if final:
        # A comment inside the event goes with it (one before its first field is a keep-alive: passed on).
        extra = [b"event: chunk", b": usage follows", b"id: 3", b"retry: 1000"] if extras else []
        events.append(nl.join([*extra, b"data: " + FINAL]) + nl + nl)
    events.append(b"data: [DONE]" + nl + nl)
    return events


FRAMINGS = {
    "lf": (b"\n", False),
    "crlf": (b"\r\n", False),
    "cr": (b"\r", False),
    "lf-fields": (b"\n", True),
    "crlf-fields": (b"\r\n", True),
    "cr-fields": (b"\r", True),
}


def _splits(data: bytes, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    cuts = sorted(set(rng.sample(range(1, len(data)), min(len(data) - 1, rng.choice((3, 20, 200))))))
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]


def _chunkings(data: bytes) -> Iterator[list[bytes]]:
    yield [data]
    yield [data[i : i + 1] for i in range(len(data))]
    for seed in range(12):
        yield _splits(data, seed)


def _parsed(chunks: list[bytes]) -> Usage | None:
    parser = SSEUsageParser()
    for chunk in chunks:
        parser.feed(chunk)
    return parser.result()


@pytest.mark.parametrize("framing", FRAMINGS)
def test_the_parser_reads_usage_in_every_framing_and_chunking(framing: str) -> None:
    nl, extras = FRAMINGS[framing]
    stream = b"".join(_events(nl, final=True, extras=extras))
    for chunks in _chunkings(stream):
        assert _parsed(chunks) == Usage(12, 2, 14)
    plain = b"".join(_events(nl, final=False, extras=extras))
    for chunks in _chunkings(plain):
        assert _parsed(chunks) is None


@pytest.mark.parametrize("framing", FRAMINGS)
def test_the_stripper_gives_back_the_stream_without_the_usage_event(framing: str) -> None:
    nl, extras = FRAMINGS[framing]
    events = _events(nl, final=True, extras=extras)
    expected = b"".join(e for e in events if FINAL not in e)
    for chunks in _chunkings(b"".join(events)):
        stripper = SSEUsageStripper()
        out = b"".join(stripper.feed(c) for c in chunks) + stripper.flush()
        assert out == expected
        assert stripper.result() == Usage(12, 2, 14) and stripper.stripped == 1


@pytest.mark.parametrize("framing", FRAMINGS)
def test_no_event_is_held_past_its_blank_line(framing: str) -> None:
    """Whatever the chunking, once the bytes up to an event's end were fed, everything the client would have
    received by then was released (a CR-only stream too: no wait for an LF that never comes)."""
    nl, extras = FRAMINGS[framing]
    events = _events(nl, final=True, extras=extras)
    stream = b"".join(events)
    ends, at = [], 0
    for event in events:
        at += len(event)
        ends.append((at, b"".join(e for e in events[: len(ends) + 1] if FINAL not in e)))
    for chunks in _chunkings(stream):
        stripper = SSEUsageStripper()
        fed, out = 0, b""
        for chunk in chunks:
            out += stripper.feed(chunk)
            fed += len(chunk)
            released = [want for end, want in ends if end <= fed]
            if released:
                assert out.startswith(released[-1]), (fed, out)


def test_a_last_event_without_its_line_ends_is_read_and_taken_out() -> None:
    """Servers end streams without the last newline: the usage event is then the last bytes of the stream."""
    head = b"data: " + _chunk("hi", "stop") + b"\n\n"
    stream = head + b"data: " + FINAL
    for chunks in _chunkings(stream):
        assert _parsed(chunks) == Usage(12, 2, 14)
        stripper = SSEUsageStripper()
        assert b"".join(stripper.feed(c) for c in chunks) + stripper.flush() == head


def test_null_usage_a_server_sends_on_every_chunk_is_left_as_sent() -> None:
    events = _events(b"\n", final=True, null_usage=True)
    stream = b"".join(events)
    stripper = SSEUsageStripper()
    out = b"".join(stripper.feed(c) for c in _splits(stream, 5)) + stripper.flush()
    assert out == b"".join(e for e in events if FINAL not in e)
    assert out.count(b'"usage":null') == 3


def test_a_keep_alive_comment_is_passed_on_at_once() -> None:
    stripper = SSEUsageStripper()
    assert stripper.feed(b": keep-alive\n") == b": keep-alive\n"
    assert stripper.feed(b"\r") == b"\r"  # a CR-only blank line: released at its CR
    assert stripper.feed(b"\n: again\r\n") == b"\n: again\r\n"  # the LF completing that CRLF goes with it


def test_a_crlf_cut_between_cr_and_lf_is_one_line_end() -> None:
    """`data: a\\r` then `\\ndata: b\\r\\n\\r\\n`: one event with two data lines, not two events."""
    reader = LineReader()
    head, lines, tail = reader.split(b"data: a\r")
    assert (head, lines, tail) == (b"", [b"data: a\r"], b"")
    head, lines, tail = reader.split(b"\ndata: b\r\n\r\n")
    assert (head, lines, tail) == (b"\n", [b"data: b\r\n", b"\r\n"], b"")
    # The usage split over two data lines, cut right inside the CRLF between them: still read.
    cut = FINAL.index(b',"usage"')
    stream = b"data: " + FINAL[:cut] + b"\r\ndata: " + FINAL[cut:] + b"\r\n\r\n"
    at = stream.index(b"\r\n") + 1
    assert _parsed([stream[:at], stream[at:]]) == Usage(12, 2, 14)
    stripper = SSEUsageStripper()
    assert stripper.feed(stream[:at]) + stripper.feed(stream[at:]) + stripper.flush() == b""


def test_usage_on_a_chunk_with_choices_is_not_taken_out() -> None:
    """llama.cpp's completions finish chunk carries usage with or without the option: it stays."""
    finish = orjson.dumps(
        {**BASE, "choices": [{"index": 0, "text": "", "finish_reason": "stop"}], "usage": USAGE}
    )
    stream = b"data: " + finish + b"\n\ndata: [DONE]\n\n"
    stripper = SSEUsageStripper()
    assert stripper.feed(stream) + stripper.flush() == stream
    assert stripper.result() == Usage(12, 2, 14) and stripper.stripped == 0


RECORDED = [p for p in recorded_fixtures() if "_stream_" in p.stem]


@pytest.mark.parametrize("nl", [b"\n", b"\r\n", b"\r"], ids=["lf", "crlf", "cr"])
@pytest.mark.parametrize("path", RECORDED, ids=lambda p: p.stem)
def test_recorded_llama_server_streams_in_every_framing(path: object, nl: bytes) -> None:
    """Real llama-server streams, their line ends rewritten to each framing, in every chunking: the same
    usage, and the stripper gives back the stream minus the usage-only event (llama.cpp's completions finish
    chunk keeps its usage: it has choices)."""
    body = load_recorded(path).body  # type: ignore[arg-type]
    assert b"\r" not in body
    stream = body.replace(b"\n", nl)
    events = [e + nl + nl for e in stream.split(nl + nl) if e]
    expected_out = b"".join(e for e in events if b'"choices":[]' not in e)
    expected = _parsed([body])
    for chunks in _chunkings(stream):
        assert _parsed(chunks) == expected
        stripper = SSEUsageStripper()
        assert b"".join(stripper.feed(c) for c in chunks) + stripper.flush() == expected_out


def _reference_strip(stream: bytes) -> bytes:
    """A whole-stream reading of WHATWG 9.2.6, for comparison: lines, events at blank lines, the usage-only
    event dropped with its lines (a comment before an event's first field is not part of it)."""
    out: list[bytes] = []
    block: list[bytes] = []
    data: list[bytes] = []

    def end() -> None:
        try:
            obj = orjson.loads(b"\n".join(data)) if data else None
        except orjson.JSONDecodeError:
            obj = None
        if not is_usage_only_chunk(obj):
            out.extend(block)
        block.clear()
        data.clear()

    for raw in re.findall(rb"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+$", stream):
        line = raw.rstrip(b"\r\n")
        if not line:
            block.append(raw)
            end()
        elif line.startswith(b":") and not block:
            out.append(raw)
        else:
            block.append(raw)
            name, _, value = line.partition(b":")
            if name == b"data":
                data.append(value[1:] if value.startswith(b" ") else value)
    if block:
        end()
    return b"".join(out)


@pytest.mark.parametrize("seed", range(30))
def test_random_streams_agree_with_a_whole_stream_reading(seed: int) -> None:
    """Line ends mixed within one stream, fields and comments anywhere, data split over lines, the usage
    event anywhere (or twice, or with null usage), a last line without its end: in every chunking the
    stripper gives what a whole-stream reading gives, and the parser reads the same usage."""
    rng = random.Random(seed)
    ends = [b"\n", b"\r\n", b"\r"]
    parts: list[bytes] = []
    for i in range(rng.randrange(3, 12)):
        data = rng.choice([_chunk(f"t{i}"), FINAL, _chunk("x", null_usage=True), b"[DONE]", b"not json"])
        lines = [
            rng.choice([b": c", b"event: e", b"id: %d" % i, b"retry: 9", b"foo"])
            for _ in range(rng.randrange(3))
        ]
        if len(data) > 20 and rng.random() < 0.3:
            cut = rng.randrange(1, len(data) - 1)
            if b"\r" not in data[:cut] and b"\n" not in data[cut:]:
                lines += [b"data: " + data[:cut], b"data:" + data[cut:]]
        else:
            lines.append(b"data: " + data)
        rng.shuffle(lines)
        parts.append(b"".join(line + rng.choice(ends) for line in lines) + rng.choice(ends))
    stream = b"".join(parts)
    if rng.random() < 0.3:
        stream = stream.rstrip(b"\r\n")  # the last line without its end
    expected = _reference_strip(stream)
    whole = _parsed([stream])
    for chunks in _chunkings(stream):
        stripper = SSEUsageStripper()
        assert b"".join(stripper.feed(c) for c in chunks) + stripper.flush() == expected
        assert _parsed(chunks) == whole
