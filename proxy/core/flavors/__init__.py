"""Server flavors: what one server does to a request before it tokenizes it, each in a module of its own.

A flavor answers four questions, by the rules its server's source follows (each module cites them):
- which renderer a model gets (core/renderers/), from the files of the model folder;
- which tokenizer and template the server really runs (llama.cpp: its own normalization and patched
  templates; vLLM: the processor's template for requests without tools);
- what the server counts for a request: its preparation of the body, then the one counting path
  (core/count.py), then what it reports of it (truncation, the usage of several prompts);
- what it refuses (a `ServerRefuses`, counted as `server_would_refuse`), media on text models included;
- how it turns an Anthropic Messages request into the chat request it serves (`messages_as_chat`).
The shared request parsing (core/extract.py, core/messages.py) follows vLLM, the reference server; a
flavor says where its server departs from it. core/model.py assembles a served model from one of these.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from ..count import CountResult, Encoder
from ..server_settings import DEFAULT_SETTINGS, ServerSettings
from ..specs import FLAVORS
from .llama_cpp import LLAMA_CPP
from .served import ServedTemplates
from .sglang import SGLANG
from .vllm import VLLM

__all__ = ["Flavor", "flavor_named"]


class Flavor(Protocol):
    @property
    def name(self) -> str:
        """The name an operator types (`--server-flavor`)."""
        ...

    @property
    def counts_images(self) -> bool:
        """Its image rule is modelled (core/vision.py): vLLM's Qwen2-VL processing."""
        ...

    @property
    def processor_template_with_tools(self) -> bool:
        """A request with tools renders with the processor's template too (vLLM: the tokenizer's)."""
        ...

    def renderer(self, folder: Path | None, settings: ServerSettings) -> str:
        """The renderer (core/renderers/) the server picks for this model folder."""
        ...

    def served_tokenizer(self, tok: Any) -> Any:
        """The transformers tokenizer as the server runs it (a copy where it differs)."""
        ...

    def uses_processor_template(self, folder: Path | None, chat_template_file: str | None) -> bool:
        """Whether the server reads the processor's template (core/templates.py) besides the tokenizer's."""
        ...

    def refuses_media(self, folder: Path | None, renderer: str) -> bool:
        """Whether the server answers 400 to a media part for this model (a text-only model)."""
        ...

    def count(
        self,
        enc: Encoder,
        endpoint: str,
        body: Any,
        streamed: bool = False,
        settings: ServerSettings = DEFAULT_SETTINGS,
        model_type: str | None = None,
    ) -> CountResult:
        """What the server counts for this request (`model_type`: config.json's). Never raises."""
        ...

    def reported(
        self, result: CountResult, endpoint: str, body: Any, streamed: bool, renderer: str
    ) -> CountResult:
        """The count as the server reports it in `usage`, from whichever renderer counted it: truncation,
        the usage of several prompts."""
        ...

    def messages_as_chat(self, body: Any, count_tokens: bool, served: ServedTemplates) -> dict[str, Any]:
        """The chat request the server serves for an Anthropic Messages (or `count_tokens`) request body.
        Raises InvalidBody (a ServerRefuses where the server answers 400)."""
        ...


_TABLE: dict[str, Flavor] = {flavor.name: flavor for flavor in (VLLM, SGLANG, LLAMA_CPP)}
assert tuple(_TABLE) == FLAVORS, "core/specs.py names the flavors an operator can type"


def flavor_named(name: str) -> Flavor:
    """The flavor an operator named (`--server-flavor`, one of core/specs.py FLAVORS)."""
    return _TABLE[name]
