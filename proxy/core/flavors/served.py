"""What a flavor may ask of the model it serves while preparing a request: the probes a server runs on its own
templates at start-up (vLLM's Messages API: does the template take a second system message, what does
`thinking: disabled` become). core/model.py's ServedModel answers them, each once per model."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from ..server_settings import ServerSettings

T = TypeVar("T")


class ServedTemplates(Protocol):
    @property
    def settings(self) -> ServerSettings:
        """What the server was started with."""
        ...

    def templates(self) -> list[str | None]:
        """The chat templates the server may render a request with (None: it renders without a Jinja
        template, through Harmony or mistral-common)."""
        ...

    def rendered(self, chat_body: dict[str, Any]) -> Any:
        """The prompt the server renders for a chat body (text or ids, equal when the prompts are), None
        when it refuses the body."""
        ...

    def once(self, key: str, compute: Callable[[], T]) -> T:
        """`compute()`, computed once per served model (a server probes at start-up, not per request)."""
        ...
