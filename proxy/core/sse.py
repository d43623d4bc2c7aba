"""The one reader of `text/event-stream` bytes, for the usage parser and the stripper (core/usage.py).

Written to WHATWG HTML "Server-sent events", 9.2.5-9.2.6 (the stream's grammar and its interpretation,
https://html.spec.whatwg.org/multipage/server-sent-events.html#event-stream-interpretation):

- A line ends in CRLF, LF or CR. A CR that ends one chunk and an LF that starts the next are one line end,
  never a line and a blank line (that would end an event the server did not end).
- A line starting with `:` is a comment; else `name:value` (one space after the colon is not part of the
  value; a line without a colon is a field with an empty value). `event`, `id`, `retry` and unknown fields
  are part of the event they are in.
- A blank line ends the event; the `data` lines of one event are joined with LF.
- One deviation: at the end of the stream, an unfinished last line and event are read as if ended. WHATWG
  discards them, but servers do end a stream without its last newline and what they meant is clear.

Bounded: at most `limit` bytes of an unfinished line are held; the bytes of a longer line are handed back as
they come (the stripper passes them on unchanged, the parser skips the event they are in).
Pure: no aiohttp, no I/O.
"""

from __future__ import annotations

import re

# An SSE line longer than this is not an event islwatch can use (usage events are a few hundred bytes).
MAX_LINE_BYTES = 1 << 20
USAGE_KEY = b'"usage"'
_LINE_END = re.compile(rb"\r\n|\r|\n")
# The last bytes of a chunk that ends with a blank line, whatever the two line ends (LF LF, CR CR, LF CR,
# CR CRLF, LF CRLF; CRLF LF and CRLF CRLF end in one of these). A CR then LF is one line end (CRLF), not two.
EVENT_ENDS = (b"\n\n", b"\r\r", b"\n\r", b"\n\r\n", b"\r\r\n")


def first_events_end(chunk: bytes) -> int:
    """The length of the shortest prefix of `chunk` that ends with a blank line (0: none)."""
    if b"\r" not in chunk:  # LF line ends, as most servers send: one search
        return chunk.find(b"\n\n") + 2 if b"\n\n" in chunk else 0
    return min((chunk.find(end) + len(end) for end in EVENT_ENDS if end in chunk), default=0)


def events_end(chunk: bytes) -> int:
    """The length of the longest prefix of `chunk` that ends with a blank line (0: none): read from a line
    start, whole events. C-speed searches from the end, whatever the chunk's size."""
    if chunk.endswith(EVENT_ENDS):
        return len(chunk)
    if b"\r" not in chunk:
        return chunk.rfind(b"\n\n") + 2 if b"\n\n" in chunk else 0
    return max((chunk.rfind(end) + len(end) for end in EVENT_ENDS if end in chunk), default=0)


class LineReader:
    """Cuts bytes fed in any chunking into raw lines, each with the line end it came with."""

    __slots__ = ("_after_cr", "_overlong", "_partial", "limit")

    def __init__(self, limit: int = MAX_LINE_BYTES) -> None:
        self.limit = limit
        self._partial = bytearray()
        self._overlong = False  # inside a line longer than `limit`: its bytes pass straight through
        self._after_cr = False  # the last line ended in a CR: an LF that comes next is part of that end

    @property
    def held(self) -> int:
        """Bytes of an unfinished line held back (at most `limit`)."""
        return len(self._partial)

    @property
    def at_line_start(self) -> bool:
        """The next byte fed starts a line, or is the LF of a CRLF already cut at its CR."""
        return not self._partial and not self._overlong

    def skip(self, chunk: bytes, end: int) -> None:
        """Pass over `chunk[:end]`, read from a line start and ending on a line end (`events_end`)."""
        self._after_cr = chunk[end - 1] == 0x0D

    def split(self, chunk: bytes) -> tuple[bytes, list[bytes], bytes]:
        """(bytes that continue the line before: the LF of a CRLF cut at its CR, or the rest of an over-long
        line up to its end; the complete lines with their ends; the start of a new over-long line). The first
        and last are not held; either may be empty."""
        start = 0
        if self._after_cr:
            self._after_cr = False
            if chunk[:1] == b"\n":
                start = 1
        if self._overlong:
            end = _LINE_END.search(chunk, start)
            if end is None:
                return chunk, [], b""
            start, self._overlong = end.end(), False
            self._after_cr = end.group() == b"\r" and start == len(chunk)
        head = chunk[:start]
        lines = []
        for end in _LINE_END.finditer(chunk, start):
            stop = end.end()
            if self._partial:
                self._partial += chunk[start:stop]
                lines.append(bytes(self._partial))
                self._partial.clear()
            else:
                lines.append(chunk[start:stop])
            start = stop
        if lines:
            # A CR at the very end cut a line; an LF first in the next chunk completes that CRLF.
            self._after_cr = chunk.endswith(b"\r")
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


def field(raw: bytes) -> tuple[bytes | None, bytes]:
    """(name, value) of a raw line; name None for a blank line, b"" for a comment (WHATWG 9.2.6)."""
    line = raw.rstrip(b"\r\n")  # only the line end: a CR or LF cannot be inside a line
    if not line:
        return None, b""
    if line[0] == 0x3A:  # ':'
        return b"", line[1:]
    name, _, value = line.partition(b":")
    return name, value[1:] if value[:1] == b" " else value


class Event:
    """The event being read, fed one raw line at a time: only the data of an event that mentions usage is
    joined (most events' data lines are dropped at their end without a copy)."""

    __slots__ = ("_broken", "_data", "_size", "_usage", "fields", "limit")

    def __init__(self, limit: int = MAX_LINE_BYTES) -> None:
        self.limit = limit
        self._data: list[bytes] = []
        self._usage = False
        self._broken = False  # a line of it was over-long, or its data over `limit`: not read
        self._size = 0
        self.fields = 0  # field and comment lines read so far

    @property
    def pending(self) -> bool:
        """Lines of an unfinished event were read."""
        return self.fields > 0 or self._broken

    def line(self, raw: bytes) -> bool:
        """Read one raw line; True when it is the blank line that ends the event."""
        name, value = field(raw)
        if name is None:
            return True
        self.fields += 1
        if name == b"data" and not self._broken:
            self._size += len(value) + 1
            if self._size > self.limit:
                self.overlong()
            else:
                self._data.append(value)
                self._usage = self._usage or USAGE_KEY in value
        return False

    def overlong(self) -> None:
        """A line of this event was too long to read: the event's data is not read."""
        self._broken = True
        self._data.clear()

    def take(self) -> bytes | None:
        """End the event: its data when it mentions usage (and was read whole), else None."""
        data = b"\n".join(self._data) if self._usage and not self._broken else None
        self._data.clear()
        self._usage = self._broken = False
        self._size = self.fields = 0
        return data
