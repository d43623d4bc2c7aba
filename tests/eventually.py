"""One way for a test to wait: poll a condition until it holds, with a generous deadline.

Analysis runs off the response path and servers start in the background, so tests wait on a condition,
never on a fixed sleep: a busy machine only makes the wait longer, never the test red. On timeout the
last value (or the last exception) is part of the failure message.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")
DEFAULT_TIMEOUT = 120.0
INTERVAL = 0.01


def _message(
    what: str, last: object, error: BaseException | None, describe: Callable[[Any], str] | None
) -> str:
    if error is not None:
        detail = f"last error {type(error).__name__}: {error}"
    else:
        try:
            detail = f"last value {describe(last) if describe is not None else repr(last)}"
        except Exception:  # a describe that cannot read this value must not hide the timeout
            detail = f"last value {last!r}"
    return f"{what} did not happen within the deadline ({detail})"


def eventually(
    probe: Callable[[], T],
    until: Callable[[T], object] = bool,
    timeout: float = DEFAULT_TIMEOUT,
    what: str = "condition",
    interval: float = INTERVAL,
    describe: Callable[[T], str] | None = None,
) -> T:
    """Call `probe` until `until(value)` is true; return that value. Exceptions of `probe` count as not
    yet (a server still starting refuses connections), and the last one is reported on timeout, as is the
    last value (through `describe` when given: a big value can say what matters in it)."""
    deadline = time.monotonic() + timeout
    last: object = None
    error: BaseException | None = None
    while True:
        try:
            last = probe()
            error = None
            if until(last):
                return last  # type: ignore[return-value]
        except Exception as exc:
            error = exc
        if time.monotonic() > deadline:
            raise AssertionError(_message(what, last, error, describe))
        time.sleep(interval)


async def eventually_async(
    probe: Callable[[], Awaitable[T] | T],
    until: Callable[[T], object] = bool,
    timeout: float = DEFAULT_TIMEOUT,
    what: str = "condition",
    interval: float = INTERVAL,
    describe: Callable[[T], str] | None = None,
) -> T:
    """`eventually` inside an event loop: `probe` may be a coroutine function or a plain function."""
    deadline = time.monotonic() + timeout
    last: object = None
    error: BaseException | None = None
    while True:
        try:
            value = probe()
            last = await value if isinstance(value, Awaitable) else value
            error = None
            if until(last):  # type: ignore[arg-type]
                return last  # type: ignore[return-value]
        except Exception as exc:
            error = exc
        if time.monotonic() > deadline:
            raise AssertionError(_message(what, last, error, describe))
        await asyncio.sleep(interval)
