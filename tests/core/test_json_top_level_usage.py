"""A JSON answer's usage is its top-level `usage` member, whatever its size, never one nested deeper.

Big answers (over JSON_WHOLE_BYTES) are scanned as they pass (core/buffers.py `JSONUsageWindow`); each is fed
whole, one byte at a time (where small enough) and in random splits, and must give what a full parse gives.
"""

from __future__ import annotations

import random

import orjson
import pytest

from proxy.core.buffers import JSON_WHOLE_BYTES, USAGE_WINDOW_BYTES, JSONUsageWindow
from proxy.core.usage import Usage, usage_from_json_bytes

FILLER = "x" * 100_000  # past JSON_WHOLE_BYTES: the answer is scanned, not kept


def _kept(body: bytes, chunks: list[bytes] | None = None) -> Usage | None:
    window = JSONUsageWindow()
    for chunk in chunks if chunks is not None else [body]:
        window.feed(chunk)
        assert window.held <= JSON_WHOLE_BYTES + 2 * USAGE_WINDOW_BYTES
    return usage_from_json_bytes(window.kept())


def _random_chunks(body: bytes, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(body)), 300))
    return [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]


def _every_way(body: bytes) -> set[Usage | None]:
    seen = {_kept(body)}
    seen |= {_kept(body, _random_chunks(body, seed)) for seed in range(8)}
    return seen


def test_a_nested_usage_after_the_top_level_one_is_not_the_count() -> None:
    """The issue's answer: a gateway's trace block with its own usage after the server's (3 was recorded
    where the server said 7,306)."""
    body = orjson.dumps(
        {
            "id": "x",
            "choices": [{"index": 0, "message": {"content": FILLER}}],
            "usage": {"prompt_tokens": 7306, "completion_tokens": 4, "total_tokens": 7310},
            "trace": {"spans": [{"usage": {"prompt_tokens": 3}}], "usage": {"prompt_tokens": 3}},
        }
    )
    assert len(body) > JSON_WHOLE_BYTES
    assert _every_way(body) == {Usage(7306, 4, 7310)}


def test_only_nested_usage_is_no_usage() -> None:
    body = orjson.dumps({"choices": [{"message": {"content": FILLER}, "usage": {"prompt_tokens": 3}}]})
    assert _every_way(body) == {None}


@pytest.mark.parametrize("first", [True, False], ids=["usage-first", "usage-last"])
def test_top_level_usage_anywhere(first: bool) -> None:
    usage = {"prompt_tokens": 31, "total_tokens": 31}
    data = [{"embedding": [0.25] * 20_000, "index": 0, "usage": {"prompt_tokens": 1}}]
    fields = {"object": "list", "usage": usage, "data": data} if first else {"object": "list", "data": data}
    if not first:
        fields["usage"] = usage
    assert _every_way(orjson.dumps(fields)) == {Usage(31, None, 31)}


def test_strings_that_look_like_structure_are_content() -> None:
    """Escaped quotes, backslash runs, brackets and a quoted usage member inside strings, cut anywhere
    (a cut inside an escape, a backslash run or a string is carried over to the next chunk)."""
    tricky = 'a"usage": {"prompt_tokens": 3}} ] [ {"\\' * 3000
    body = orjson.dumps(
        {
            "choices": [{"message": {"content": tricky}}],
            "note": "\\",
            "usage": {"prompt_tokens": 9},
            "tail": '}}]]\\"',
        }
    )
    assert len(body) > JSON_WHOLE_BYTES
    assert _every_way(body) == {Usage(9)}
    near_end = [body[i : i + 1] for i in range(len(body) - 400, len(body))]
    assert _kept(body, [body[: len(body) - 400], *near_end]) == Usage(9)


def test_duplicate_and_escaped_top_level_keys_read_as_a_parser_reads_them() -> None:
    """Duplicate keys: the last wins (orjson, Python's json); `"us\\u0061ge"` is the key usage."""
    head = b'{"data":"' + FILLER.encode() + b'",'
    dup = head + b'"usage":{"prompt_tokens":1},"x":1,"usage":{"prompt_tokens":2}}'
    assert usage_from_json_bytes(dup) == Usage(2) and _every_way(dup) == {Usage(2)}
    escaped = head + b'"us\\u0061ge":{"prompt_tokens":5}}'
    assert usage_from_json_bytes(escaped) == Usage(5) and _every_way(escaped) == {Usage(5)}
    as_value = head + b'"object":"usage","n":{"usage":{"prompt_tokens":4}}}'
    assert _every_way(as_value) == {None}


def test_a_truncated_or_non_object_answer_has_no_usage() -> None:
    body = orjson.dumps({"data": FILLER, "usage": {"prompt_tokens": 8, "total_tokens": 8}})
    assert _every_way(body[:-3]) == {None}  # the answer ended inside its usage value
    listed = orjson.dumps([{"data": FILLER, "usage": {"prompt_tokens": 8}}])
    assert _every_way(listed) == {None}


def test_a_small_answer_is_kept_whole_and_parsed() -> None:
    body = b'{"usage": {"prompt_tokens": 5}, "trace": {"usage": {"prompt_tokens": 3}}}'
    window = JSONUsageWindow()
    for i in range(len(body)):
        window.feed(body[i : i + 1])
    assert window.kept() == body and usage_from_json_bytes(body) == Usage(5)
    assert usage_from_json_bytes(b'{"trace": {"usage": {"prompt_tokens": 3}}, "choices": [') is None


def test_one_byte_at_a_time_past_the_whole_limit() -> None:
    body = orjson.dumps(
        {
            "choices": [{"message": {"content": 'y\\"[{' * 14_000}}],
            "usage": {"prompt_tokens": 21},
            "z": {"usage": {"prompt_tokens": 1}},
        }
    )
    assert len(body) > JSON_WHOLE_BYTES
    assert _kept(body, [body[i : i + 1] for i in range(len(body))]) == Usage(21)


def test_an_answer_of_many_top_level_members() -> None:
    """The top level itself is big: keys cut anywhere by the chunks, the usage member among them."""
    first = {f"k{i}": f"v{i}" for i in range(6000)}
    last = {f"m{i}": [i, {"usage": {"prompt_tokens": 2}}] for i in range(3000)}
    body = orjson.dumps({**first, "usage": {"prompt_tokens": 77}, **last})
    assert len(body) > JSON_WHOLE_BYTES and usage_from_json_bytes(body) == Usage(77)
    assert _every_way(body) == {Usage(77)}


def test_values_nested_deeper_than_one_chunk_holds() -> None:
    """Thousands of levels in one chunk: read token by token there (linear), usage still found."""
    deep = b"[" * 3000 + b'"]]"' + b"]" * 3000
    body = b'{"pad":"' + b"p" * 70_000 + b'","a":' + deep + b',"usage":{"prompt_tokens":4},"b":' + deep + b"}"
    assert _kept(body, [body[i : i + 8192] for i in range(0, len(body), 8192)]) == Usage(4)
    assert _kept(body) == Usage(4)


def _random_value(rng: random.Random, depth: int) -> object:
    kind = rng.random()
    if depth > 6 or kind < 0.3:
        return rng.choice(
            [1, -2.5e10, True, None, "", 'a"b\\\\c{[', '"usage": {', "\\", "é\u2028😀", "x" * 300]
        )
    if kind < 0.6:
        return [_random_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    obj = {}
    for _ in range(rng.randrange(5)):
        key = rng.choice(["usage", "a", 'k"{', "\\usage", "usage\\"])
        obj[key] = {"prompt_tokens": rng.randrange(100)} if key == "usage" else _random_value(rng, depth + 1)
    return obj


@pytest.mark.parametrize("seed", range(25))
def test_random_answers_read_as_a_full_parse_reads_them(seed: int) -> None:
    """Random documents (quotes, backslashes and brackets in strings, usage members at every depth, the
    top-level one or none) padded past JSON_WHOLE_BYTES: the scan agrees with orjson in every chunking."""
    rng = random.Random(seed)
    top = {f"f{i}": _random_value(rng, 1) for i in range(rng.randrange(1, 40))}
    if rng.random() < 0.7:
        top["usage"] = {"prompt_tokens": rng.randrange(1000), "total_tokens": 5}
        if rng.random() < 0.5:  # the usage member moves before the padding
            top = {"usage": top.pop("usage"), **top}
    top["pad"] = ["\\" * rng.randrange(3) + '"' * rng.randrange(3) + "y" * 500 for _ in range(150)]
    top["tail"] = _random_value(rng, 1)
    body = orjson.dumps(top)
    assert len(body) > JSON_WHOLE_BYTES
    assert _every_way(body) == {usage_from_json_bytes(body)}
