"""The bounded buffers on the response path: what islwatch may hold of an answer while relaying it.

Both work in linear time (each byte is copied a bounded number of times, never re-concatenated) and hold a
bounded number of bytes whatever the upstream sends:

- `LineSplitter` cuts a byte stream into lines for the SSE usage parser and stripper. It holds at most
  `limit` bytes of an unfinished line; the bytes of a longer line are handed back as they come (the stripper
  passes them to the client unchanged, the parser skips them), up to and including the newline that ends it.
- `JSONUsageWindow` keeps what a JSON answer's usage can be read from: the whole answer when it is small,
  else the bytes that follow each `"usage"` key, wherever the key is: at the end (OpenAI, vLLM, llama.cpp
  chat and completions: after `choices`) or at the start (llama.cpp's embeddings answer is `model`,
  `object`, `usage`, then the `data` array; tools/server/utils.hpp format_embeddings_response_oaicompat).
"""

from __future__ import annotations

from collections import deque

USAGE_KEY = b'"usage"'
# An SSE line longer than this is not an event islwatch can use (usage events are a few hundred bytes).
MAX_LINE_BYTES = 1 << 20
# A JSON answer up to this size is kept whole (one full parse); a bigger one keeps only usage windows.
JSON_WHOLE_BYTES = 64 << 10
# Bytes kept from each `"usage"` key on: servers' usage objects are a few hundred bytes.
USAGE_WINDOW_BYTES = 4 << 10
USAGE_WINDOWS = 4  # the last windows kept (the last usage object in the answer is the one that counts)


class LineSplitter:
    """Splits bytes fed in any chunking into lines (without their newline), holding at most `limit` bytes."""

    def __init__(self, limit: int = MAX_LINE_BYTES) -> None:
        self.limit = limit
        self._partial = bytearray()
        self._overlong = False  # inside a line longer than `limit`: its bytes pass straight through

    @property
    def held(self) -> int:
        """Bytes of an unfinished line held back (at most `limit`)."""
        return len(self._partial)

    @property
    def at_line_start(self) -> bool:
        """The next byte fed starts a new line (no unfinished line held or being skipped)."""
        return not self._partial and not self._overlong

    def split(self, chunk: bytes) -> tuple[bytes, list[bytes], bytes]:
        """(the rest of an over-long line up to its newline included, the complete lines, the start of a new
        over-long line): the two raw parts are bytes that are not held; either may be empty."""
        head = b""
        start = 0
        if self._overlong:
            end = chunk.find(b"\n")
            if end < 0:
                return chunk, [], b""
            head, start, self._overlong = chunk[: end + 1], end + 1, False
        lines = []
        end = chunk.find(b"\n", start)
        if self._partial and end >= 0:
            self._partial += chunk[start:end]
            lines.append(bytes(self._partial))
            self._partial.clear()
            start, end = end + 1, chunk.find(b"\n", end + 1)
        while end >= 0:
            lines.append(chunk[start:end])
            start, end = end + 1, chunk.find(b"\n", end + 1)
        tail = b""
        if start < len(chunk):
            if len(self._partial) + len(chunk) - start > self.limit:
                tail = bytes(self._partial) + chunk[start:]
                self._partial.clear()
                self._overlong = True
            else:
                self._partial += chunk[start:]
        return head, lines, tail

    def rest(self) -> bytes:
        """The unfinished line at the end of the stream (servers do end a stream without a newline)."""
        rest = bytes(self._partial)
        self._partial.clear()
        return rest


class JSONUsageWindow:
    """Keeps, of a JSON answer fed in any chunking, what its usage can be read from (bounded bytes).

    `kept()` is the whole answer when it is at most `whole` bytes; else the last `USAGE_WINDOWS` windows of
    `window` bytes, each starting at a `"usage"` key, joined by newlines: `usage_from_json_bytes` finds the
    last complete usage object in them. An unescaped `"usage"` can only be a key (quotes inside strings are
    escaped), so no string content starts a window. Held: at most `whole` + the windows.
    """

    def __init__(self, whole: int = JSON_WHOLE_BYTES, window: int = USAGE_WINDOW_BYTES) -> None:
        self.whole_limit = whole
        self.window = window
        self._whole: bytearray | None = bytearray()
        self._carry = b""  # the last bytes of the previous chunk: a key split across two chunks
        self._open: bytearray | None = None  # the window still filling
        self._windows: deque[bytes] = deque(maxlen=USAGE_WINDOWS)

    @property
    def held(self) -> int:
        whole = len(self._whole) if self._whole is not None else 0
        return whole + sum(map(len, self._windows)) + (len(self._open) if self._open is not None else 0)

    def feed(self, chunk: bytes) -> None:
        if self._whole is not None:
            if len(self._whole) + len(chunk) <= self.whole_limit:
                self._whole += chunk
            else:
                self._whole = None
        if self._open is not None:
            self._open += chunk[: self.window - len(self._open)]
            self._close_if_full()
        data = self._carry + chunk if self._carry else chunk
        at = data.find(USAGE_KEY)
        while at >= 0:
            self._close()
            self._open = bytearray(data[at : at + self.window])
            self._close_if_full()
            at = data.find(USAGE_KEY, at + 1)
        self._carry = data[-(len(USAGE_KEY) - 1) :]

    def kept(self) -> bytes:
        if self._whole is not None:
            return bytes(self._whole)
        self._close()
        return b"\n".join(self._windows)

    def _close_if_full(self) -> None:
        if self._open is not None and len(self._open) >= self.window:
            self._close()

    def _close(self) -> None:
        if self._open is not None:
            self._windows.append(bytes(self._open))
            self._open = None
