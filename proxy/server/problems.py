"""The one-line problem log: no prompt text, ever; repeated problems are summarised instead of flooding."""

from __future__ import annotations

import logging
import time
import traceback
from typing import Any


class ProblemLog:
    """One log line per problem, without content; at most one line per reason per `interval` seconds,
    the next line saying how many were not logged, so a flood of bad requests cannot flood the log."""

    def __init__(self, logger: logging.Logger, interval: float = 10.0) -> None:
        self._log = logger
        self._interval = interval
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def __call__(self, reason: str, message: str, *args: Any, level: int = logging.WARNING) -> None:
        now = time.monotonic()
        last = self._last.get(reason)
        if last is not None and now - last < self._interval:
            self._suppressed[reason] = self._suppressed.get(reason, 0) + 1
            return
        self._last[reason] = now
        skipped = self._suppressed.pop(reason, 0)
        suffix = f" ({skipped} more since the last such line)" if skipped else ""
        self._log.log(level, f"{reason}: {message}{suffix}", *args)


def traceback_line(exc: BaseException, frames: int = 8) -> str:
    """An exception as one content-free line: its class and its innermost frames (file:line function),
    innermost first. Never its message: an error raised on a request (a KeyError, a parser's complaint) may
    quote the request."""
    summary = traceback.extract_tb(exc.__traceback__)[-frames:]
    where = " < ".join(f"{_short_path(f.filename)}:{f.lineno} {f.name}" for f in reversed(summary))
    return f"{type(exc).__name__} at {where or '?'}"


def _short_path(filename: str) -> str:
    """`.../site-packages/transformers/x.py` -> `transformers/x.py`, `/repo/proxy/core/x.py` ->
    `proxy/core/x.py`: no home directories or checkout paths in the log."""
    for marker in ("site-packages/", "/proxy/", "/loadgen/"):
        at = filename.rfind(marker)
        if at >= 0:
            return filename[at:].removeprefix("site-packages/").removeprefix("/")
    return filename.rsplit("/", 1)[-1]
