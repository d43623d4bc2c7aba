"""A small bounded, thread-safe LRU of digest -> count, and the digest: the fast encoder's caches.

The caches hold 16-byte BLAKE2b digests and integer counts, never a client's text.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from typing import Any


class Lru:
    """A bounded mapping digest -> count, least recently used evicted first."""

    def __init__(self, entries: int) -> None:
        self._entries = max(0, entries)
        self._data: OrderedDict[Any, int] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: Any) -> int | None:
        with self._lock:
            value = self._data.get(key)
            if value is None:
                self.misses += 1
                return None
            self._data.move_to_end(key)
            self.hits += 1
            return value

    def put(self, key: Any, value: int) -> None:
        if not self._entries:
            return
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self._entries:
                self._data.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self.hits = self.misses = 0

    def keys(self) -> list[Any]:
        with self._lock:
            return list(self._data)

    def __len__(self) -> int:
        return len(self._data)


def digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()
