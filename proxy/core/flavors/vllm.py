"""vLLM 0.32 / 0.33 (`--server-flavor vllm`, the default): the reference server.

Its message preparation is the shared path (core/extract.py, core/messages.py, each rule cited there). What
is vLLM's alone lives here:
- the renderer: `model_type == "gpt_oss"` in config.json builds the prompt with Harmony
  (`vllm/renderers/online_renderer.py` `use_harmony`, renderers/harmony.py); a folder with
  `consolidated*.safetensors` and a `tekken.json` or `tokenizer.model.v*` is served in `mistral` tokenizer
  mode through mistral-common (`vllm/tokenizers/registry.py`, renderers/mistral.py); anything else renders
  its Jinja chat template;
- the template, per request: the processor's when the request has no tools (`vllm/renderers/hf.py`
  `resolve_chat_template`, core/templates.py), unless the server was given `--chat-template`;
- media parts for a model served as text-only are a 400 (`vllm/multimodal/registry.py`), but on the Harmony
  path, which never asks the multimodal registry (`_make_request_with_harmony`);
- the refusals vLLM's request model makes (`ServerSettings.vllm_refusals`, core/messages.py);
- `truncate_prompt_tokens`: the prompt cut to that many tokens (`truncated`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..count import CountResult, Encoder, count
from ..endpoints import Endpoint
from ..renderers import HARMONY, JINJA, MISTRAL
from ..renderers.mistral import is_mistral_folder
from ..server_settings import DEFAULT_SETTINGS, ServerSettings
from ..templates import PROCESSOR_FILES
from .served import ServedTemplates
from .vllm_messages import disabled_thinking_effort, messages_as_chat, template_refuses_inline_system

GPT_OSS = "gpt_oss"  # config.json's model_type that vLLM renders with Harmony


def model_type(folder: Path | None) -> str | None:
    """config.json's `model_type`, what vLLM's `hf_config.model_type` reads."""
    if folder is None:
        return None
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    value = config.get("model_type") if isinstance(config, dict) else None
    return value if isinstance(value, str) else None


def _mistral_vision(folder: Path) -> bool:
    """A Mistral folder's params.json names its vision encoder (Pixtral, Mistral Small 3.1+), which vLLM's
    Mistral config reader turns into a multimodal model (`vllm/transformers_utils/configs/mistral.py`)."""
    try:
        params = json.loads((folder / "params.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(params, dict) and any(k in params for k in ("vision_encoder", "multimodal"))


def _text_model(folder: Path) -> bool:
    """A model folder (it has a config.json) without a processor: vLLM serves it without multimodal support.
    A bare tokenizer folder says nothing of the model, so nothing is refused for it."""
    if not (folder / "config.json").is_file():
        return False
    return not any((folder / name).is_file() for name in PROCESSOR_FILES)


def truncated(result: CountResult, body: Any) -> CountResult:
    """vLLM keeps at most `truncate_prompt_tokens` tokens of each prompt, from the side `truncation_side`
    says (`vllm/renderers/params.py` TokenizeParams; the chat and completion request models hand it over).
    A positive N caps each prompt's count at N. -1 caps it at the model's context, which islwatch does not
    know: a prompt that long would be refused without it, so the count stands. 0 is left unmodelled."""
    n = body.get("truncate_prompt_tokens") if isinstance(body, dict) else None
    if not isinstance(n, int) or isinstance(n, bool) or n < 1 or result.expected_server is None:
        return result
    if len(result.prompts) > 1 and sum(result.prompts) == result.expected_server:  # completions' prompt list
        return replace(result, expected_server=sum(min(p, n) for p in result.prompts))
    return replace(result, expected_server=min(result.expected_server, n))


@dataclass(frozen=True)
class VllmFlavor:
    name: str = "vllm"
    processor_template_with_tools: bool = False
    counts_images: bool = True

    def renderer(self, folder: Path | None, settings: ServerSettings) -> str:
        if folder is None:
            return JINJA
        if model_type(folder) == GPT_OSS:
            return HARMONY
        mode = settings.tokenizer_mode
        if mode == "mistral" or (mode == "auto" and is_mistral_folder(folder)):
            return MISTRAL
        return JINJA

    def served_tokenizer(self, tok: Any) -> Any:
        return tok

    def uses_processor_template(self, folder: Path | None, chat_template_file: str | None) -> bool:
        return folder is not None and chat_template_file is None

    def refuses_media(self, folder: Path | None, renderer: str) -> bool:
        if folder is None or renderer == HARMONY:
            return False
        if renderer == MISTRAL:
            return not _mistral_vision(folder)
        return _text_model(folder)

    def count(
        self,
        enc: Encoder,
        endpoint: str,
        body: Any,
        streamed: bool = False,
        settings: ServerSettings = DEFAULT_SETTINGS,
        model_type: str | None = None,
    ) -> CountResult:
        return count(enc, endpoint, body, settings)

    def reported(
        self, result: CountResult, endpoint: str, body: Any, streamed: bool, renderer: str
    ) -> CountResult:
        # The Harmony path (gpt-oss's chat and responses) builds the ids itself and cuts nothing
        # (online_renderer.py _make_request_with_harmony: no TokenizeParams); its completions are cut.
        # Measured on 0.32 and 0.33 (tests/vllm_oracle).
        harmony = renderer == HARMONY and endpoint in (Endpoint.CHAT, Endpoint.RESPONSES)
        return result if harmony else truncated(result, body)

    def messages_as_chat(self, body: Any, count_tokens: bool, served: ServedTemplates) -> dict[str, Any]:
        # Both probed once, as AnthropicServingMessages does: the merge at start-up (for the templates the
        # renderer applies with and without tools), the effort on the first `thinking: disabled` request.
        merge = served.once(
            "vllm.merge_inline_system",
            lambda: any(template_refuses_inline_system(t) for t in served.templates()),
        )
        thinking = body.get("thinking") if isinstance(body, dict) else None
        effort = "none"
        if isinstance(thinking, dict) and thinking.get("type") == "disabled":
            probe = {"messages": [{"role": "user", "content": "Hi"}]}
            effort = served.once(
                "vllm.disabled_thinking_effort",
                lambda: disabled_thinking_effort(lambda e: served.rendered({**probe, "reasoning_effort": e})),
            )
        jinja = any(t is not None for t in served.templates())
        return messages_as_chat(body, count_tokens, merge, effort, jinja)


VLLM = VllmFlavor()
