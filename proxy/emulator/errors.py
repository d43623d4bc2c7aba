"""The emulator's one refusal. A leaf module, so counting and planning both raise it without importing
each other; `answers.error_body` turns it into vLLM's JSON error body."""

from __future__ import annotations


class RequestError(Exception):
    """A request the emulator refuses, answered as vLLM's JSON error body with `status`."""

    def __init__(self, message: str, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.param = param
