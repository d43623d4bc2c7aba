"""What islwatch may hold of a JSON answer while relaying it: `JSONUsageWindow`, bounded bytes, linear time.

A small answer is kept whole (the worker parses it: its top-level `usage`). A big one is scanned as it
passes, tracking only where each value starts and ends (strings, objects, arrays), to keep the value of its
top-level `usage` member: wherever it is, at the end (OpenAI, vLLM, llama.cpp chat and completions: after
`choices`) or at the start (llama.cpp's embeddings answer is `model`, `object`, `usage`, then `data`;
tools/server/utils.hpp format_embeddings_response_oaicompat), and never a `usage` nested deeper (a gateway's
trace block, a tool's result). The SSE reader is core/sse.py.
"""

from __future__ import annotations

import re

import orjson

from .sse import USAGE_KEY

# A JSON answer up to this size is kept whole (one full parse); a bigger one keeps only its usage value.
JSON_WHOLE_BYTES = 64 << 10
# The most kept of a top-level usage value: servers' usage objects are a few hundred bytes.
USAGE_WINDOW_BYTES = 4 << 10
# The longest top-level key read (escapes included): anything longer is not `usage`.
_KEY_BYTES = 64

# A whole JSON string, and a string's content up to its closing quote (or the end, or a lone backslash there).
_STRING = re.compile(rb'"(?:[^"\\]++|\\.)*+"', re.S)
_STRING_REST = re.compile(rb'(?:[^"\\]++|\\.)*+', re.S)
# Every byte but quotes and brackets (deleted to reduce a chunk to its structure), and a string in what is left.
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b'"{}[]')
_SKELETON_STRING = re.compile(rb'"[^"]*"')
# Balanced pairs removed per chunk at most: a chunk nested deeper is read token by token (linear either way).
_COLLAPSE_PASSES = 64
_TOKEN = re.compile(rb'[{}\[\]:,"]')


class JSONUsageWindow:
    """Keeps, of a JSON answer fed in any chunking, what its top-level usage can be read from.

    `kept()` is the whole answer when it is at most `whole` bytes; else `{"usage": <value>}` with the value
    of the last top-level `usage` member (duplicate keys: the last wins, as in orjson and Python's json), or
    b"" when there is none, it is over `window` bytes, or the answer ended inside it. Held: at most `whole`
    bytes, then at most `window`.

    The scan of a big answer costs C-speed passes per chunk (regex and count over the chunk) while it is
    inside a nested value that does not end in the chunk; only the few chunks where the top level is reached
    are read token by token (the top level of an answer has a handful of members).
    """

    def __init__(self, whole: int = JSON_WHOLE_BYTES, window: int = USAGE_WINDOW_BYTES) -> None:
        self.whole_limit = whole
        self.window = window
        self._whole: bytearray | None = bytearray()
        self._depth = 0
        self._root_object = False
        self._in_string = False
        self._escape = False  # inside a string, the last byte fed was an unpaired backslash
        self._key: bytearray | None = None  # a top-level string being read (a key if ':' follows)
        self._usage_key = False  # the last top-level token was the string "usage"
        self._capture: bytearray | None = None  # the top-level usage value being read
        self._value: bytes | None = None

    @property
    def held(self) -> int:
        whole = len(self._whole) if self._whole is not None else 0
        return whole + (len(self._capture) if self._capture is not None else 0) + len(self._value or b"")

    def feed(self, chunk: bytes) -> None:
        if self._whole is not None:
            if len(self._whole) + len(chunk) <= self.whole_limit:
                self._whole += chunk
                return
            kept, self._whole = bytes(self._whole), None  # too big to keep: scan what was kept, then on
            self._scan(kept)
        self._scan(chunk)

    def kept(self) -> bytes:
        if self._whole is not None:
            return bytes(self._whole)
        if self._value is None or self._capture is not None:
            return b""
        return b'{"usage":' + self._value + b"}"

    def _scan(self, chunk: bytes) -> None:
        pos, n = 0, len(chunk)
        cap = 0  # where the capture resumes in this chunk
        skip = True  # the C-speed skip may apply (tried again when back at the top level)
        while pos < n:
            if self._in_string:
                pos = self._string(chunk, pos)
                continue
            if skip and self._depth >= 1:
                skip = False
                pos = self._skip(chunk, pos)
                continue
            token = _TOKEN.search(chunk, pos)
            if token is None:
                break
            c, pos = chunk[token.start()], token.end()
            if c == 0x22:  # '"'
                self._in_string = True
                if self._depth == 1 and self._root_object:
                    self._key = bytearray()
                continue
            usage_key, self._usage_key = self._usage_key, False
            if c in (0x7B, 0x5B):  # '{' '['
                if self._depth == 0:
                    self._root_object = c == 0x7B
                self._depth += 1
            elif c in (0x7D, 0x5D):  # '}' ']'
                self._depth -= 1
                if self._depth == 0 and self._capture is not None:
                    cap = self._end_capture(chunk, cap, token.start())
                # Back at the top level: the rest may be skipped if no usage member can be in it.
                skip = self._depth == 1 and not self._relevant(chunk, pos)
            elif self._depth == 1 and self._root_object:
                if c == 0x3A and usage_key:  # ':' after the key "usage": its value starts here
                    self._capture, self._value, cap = bytearray(), None, pos
                elif c == 0x2C and self._capture is not None:  # ','
                    cap = self._end_capture(chunk, cap, token.start())
        if self._capture is not None:
            self._capture += chunk[cap:]
            if len(self._capture) > self.window:  # not a server's usage: the last usage member is unread
                self._capture = None

    def _relevant(self, chunk: bytes, pos: int) -> bool:
        """From `pos`, the chunk may hold (or continue) a top-level usage member: a `"usage"` key, an
        escaped key that may spell it, a key read just before, or a usage value being read."""
        return (
            self._capture is not None
            or self._usage_key
            or chunk.find(USAGE_KEY, pos) >= 0
            or chunk.find(b"\\u", pos) >= 0
        )

    def _end_capture(self, chunk: bytes, cap: int, end: int) -> int:
        assert self._capture is not None
        self._capture += chunk[cap:end]
        if len(self._capture) <= self.window:
            self._value = bytes(self._capture).strip()
        self._capture = None
        return end

    def _string(self, chunk: bytes, pos: int) -> int:
        """Read string content from `pos`: the position after its closing quote, or the chunk's end."""
        start = pos
        if self._escape:
            self._escape, pos = False, pos + 1
        end = _STRING_REST.match(chunk, pos).end()  # type: ignore[union-attr]
        closed = end < len(chunk) and chunk[end] == 0x22
        if not closed and end < len(chunk):
            self._escape = True  # a lone backslash is the chunk's last byte
        if self._key is not None:
            if len(self._key) + end - start <= _KEY_BYTES:
                self._key += chunk[start:end]
            else:
                self._key = None
        if not closed:
            return len(chunk)
        self._in_string = False
        if self._key is not None:
            self._usage_key = _is_usage(bytes(self._key))
            self._key = None
        return end + 1

    def _skip(self, chunk: bytes, pos: int) -> int:
        """Pass over `chunk[pos:]` (outside a string, inside the root) without a step per token where that
        is safe: the position to read on from, `pos` when nothing was skipped.

        The chunk is reduced to its structure: escaped backslashes and quotes removed, every byte but quotes
        and brackets deleted, strings removed, then balanced pairs: what is left is the closes and opens
        that cross the chunk. Skipped when that never brings the scan back to the top level, or when it does
        but the chunk can hold no usage member (`_relevant`). A string still open at the end at the top
        level may be a key: the scan reads on from its opening quote."""
        rest = chunk[pos:] if pos else chunk
        flat = rest
        if b"\\" in flat:
            flat = flat.replace(b"\\\\", b"").replace(b'\\"', b"")
        flat = flat.translate(None, _NOT_STRUCTURE).replace(b'""', b"")  # adjacent quotes: string bounds
        if b'"' in flat:
            flat = _SKELETON_STRING.sub(b"", flat)
        quote = flat.find(b'"')  # a string still open at the chunk's end
        if quote >= 0:
            flat = flat[:quote]
        for _ in range(_COLLAPSE_PASSES):
            inner = flat.replace(b"{}", b"").replace(b"[]", b"")
            if len(inner) == len(flat):
                break
            flat = inner
        else:
            return pos  # nested deeper than the passes reach within one chunk: read token by token
        closes = flat.count(b"}") + flat.count(b"]")
        lowest = self._depth - closes
        if lowest < 1 or (lowest < 2 and self._relevant(chunk, pos)):
            return pos
        self._depth += len(flat) - 2 * closes
        if quote < 0:
            return len(chunk)
        if self._depth >= 2:
            self._in_string = True
            self._escape = (len(rest) - len(rest.rstrip(b"\\"))) % 2 == 1
            return len(chunk)
        return pos + _open_quote(rest)


def _open_quote(data: bytes) -> int:
    """Where the string still open at the end of `data` starts: its last quote not escaped (no unescaped
    quote follows an opening one inside a string)."""
    at = len(data)
    while True:
        at = data.rfind(b'"', 0, at)
        before = at - 1
        while before >= 0 and data[before] == 0x5C:  # backslash
            before -= 1
        if (at - 1 - before) % 2 == 0:
            return at


def _is_usage(key: bytes) -> bool:
    if b"\\" not in key:
        return key == b"usage"
    try:  # an escaped key (`"us\\u0061ge"`) is the same key to a JSON parser
        return bool(orjson.loads(b'"' + key + b'"') == "usage")
    except orjson.JSONDecodeError:
        return False
