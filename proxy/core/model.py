"""One served model, prepared as its server prepares requests: the one place the counting path is assembled
(the proxy's workers, `islwatch count`, the tests).

What the server chooses, by its own rules (vLLM 0.32):
- the renderer, from the model folder: `model_type == "gpt_oss"` in config.json builds the prompt with
  Harmony (`vllm/renderers/online_renderer.py` `use_harmony`, core/harmony.py); a folder with
  `consolidated*.safetensors` and a `tekken.json` or `tokenizer.model.v*` is served in `mistral` tokenizer
  mode through mistral-common (`vllm/tokenizers/registry.py`, core/mistral.py); anything else renders its
  Jinja chat template (core/count.py);
- the template, per request (core/templates.py): the processor's when the request has no tools;
- the server-wide settings it was started with (core/server_settings.py).
SGLang and llama.cpp render Jinja templates (core/flavor.py).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .count import (
    CHAT_TEMPLATE,
    SERVER_REFUSES,
    CountResult,
    Encoder,
    bare_result,
    not_counted,
    parse,
    uncounted,
)
from .diagnose import DriftProfile, build_profile
from .endpoints import Endpoint
from .extract import ChatInput, responses_as_chat
from .fast import best_encoder
from .flavor import count_as, flavored_tokenizer
from .harmony import HarmonyRenderer, load_harmony, server_date
from .images import ImageModel
from .messages import REFUSES, InvalidBody
from .mistral import MistralRenderer, is_mistral_folder, load_mistral
from .mistral_request import MediaNotModelled
from .server_settings import DEFAULT_SETTINGS, ServerSettings
from .templates import PROCESSOR_FILES, Template, has_tools, processor_template, tokenizer_template_source
from .tokenizer import LoadedTokenizer, TokenizerIdentity, load_mistral_identity, load_tokenizer
from .vision import image_model_for

JINJA = "jinja"
HARMONY = "harmony"
MISTRAL = "mistral"
RENDERERS = (JINJA, HARMONY, MISTRAL)


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


def renderer_for(flavor: str, folder: Path | None, tokenizer_mode: str = "auto") -> str:
    """The renderer the flavor's server picks for this model folder (module docstring)."""
    if flavor != "vllm" or folder is None:
        return JINJA
    if model_type(folder) == "gpt_oss":
        return HARMONY
    if tokenizer_mode == "mistral" or (tokenizer_mode == "auto" and is_mistral_folder(folder)):
        return MISTRAL
    return JINJA


@dataclass(frozen=True)
class ServedModel:
    identity: TokenizerIdentity
    flavor: str
    settings: ServerSettings
    renderer: str
    encoder: Encoder  # the tokenizer's template; also the bare count for every renderer
    processor_encoder: Encoder | None = None  # the processor's template, for requests without tools
    tokenizer: Any = None  # the transformers tokenizer counted with (None: mistral-common only)
    harmony: HarmonyRenderer | None = None
    mistral: MistralRenderer | None = None
    text_only: bool = False  # vLLM serves the folder as a text model: media parts are refused
    model_type: str | None = None  # config.json's (SGLang keys a gpt-oss rule on it)

    def count(self, endpoint: str, body: Any, streamed: bool = False) -> CountResult:
        """What the server counts for this request. Never raises but on an islwatch bug (core/count.py)."""
        result = self._count(endpoint, body, streamed)
        if self.text_only and result.media_parts:
            # vllm/multimodal/registry.py: a media part for a model that is not multimodal is a 400
            why = REFUSES + "media parts for a model that is not multimodal"
            return uncounted(endpoint, SERVER_REFUSES, why)
        return result

    def _count(self, endpoint: str, body: Any, streamed: bool) -> CountResult:
        if self.harmony is not None and endpoint in (Endpoint.CHAT, Endpoint.RESPONSES):
            date = server_date(self.settings.harmony_start_date)
            harmony = self.harmony
            if endpoint == Endpoint.CHAT:
                return self._rendered(endpoint, body, lambda b: harmony.harmony_chat_ids(b, start_date=date))
            return self._rendered(endpoint, body, lambda b: harmony.harmony_responses_ids(b, start_date=date))
        if self.mistral is not None and endpoint == Endpoint.CHAT:
            return self._rendered(endpoint, body, self.mistral.chat_ids)
        if self.mistral is not None and endpoint == Endpoint.RESPONSES:  # its chat request, through mistral
            mistral = self.mistral
            return self._rendered(endpoint, body, lambda b: mistral.chat_ids(responses_as_chat(b)))
        use_processor = self.processor_encoder is not None and not has_tools(body)
        enc = self.processor_encoder if use_processor and self.processor_encoder else self.encoder
        return count_as(self.flavor, enc, endpoint, body, streamed, self.settings, self.model_type)

    def _rendered(self, endpoint: str, body: Any, ids_of: Callable[[Any], list[int]]) -> CountResult:
        """A renderer that makes the prompt's ids itself (Harmony, mistral-common): the bare count from the
        request's texts as always, the templated count from the ids. A request with media parts the renderer
        cannot count (their tokens come from the server's multimodal processor) is counted bare, and its
        media name the drift (the `media` cause)."""
        enc = self.encoder
        try:
            chat = parse(endpoint, body, enc.parts_format, enc.developer_role, self.settings)
            assert isinstance(chat, ChatInput)
            fallback = bare_result(chat, endpoint, enc.texts_len(chat.texts))
            ids = ids_of(body)
        except InvalidBody as exc:
            return not_counted(endpoint, exc)
        except MediaNotModelled:
            return fallback
        return replace(fallback, templated=len(ids), expected_server=len(ids), method=CHAT_TEMPLATE)

    def describe(self) -> dict[str, Any]:
        """The identity with what the server was found to render with (/readyz, islwatch_tokenizer_info)."""
        return self.identity.as_dict()


class MistralEncoder:
    """The bare count of a model served through mistral-common alone (no transformers tokenizer)."""

    template: str | None = None
    parts_format = False
    developer_role = False
    bos_text: str | None = None
    images: ImageModel | None = None

    def __init__(self, mistral: MistralRenderer) -> None:
        self.mistral = mistral

    def texts_len(self, texts: list[str]) -> int:
        return self.mistral.text_len(texts)

    def render(self, chat: ChatInput) -> str:
        raise NotImplementedError("mistral-common renders ids, not text")

    def rendered_len(self, text: str) -> int:
        return len(self.mistral.encode(text, False))

    def encode_len(self, text: str, add_special_tokens: bool) -> int:
        return len(self.mistral.encode(text, add_special_tokens))


def load_served_model(
    spec: str,
    flavor: str = "vllm",
    settings: ServerSettings = DEFAULT_SETTINGS,
    *,
    revision: str | None = None,
    chat_template_file: str | None = None,
    trust_remote_code: bool = False,
    images: Callable[[Any], ImageModel | None] | None = None,
) -> ServedModel:
    """Load `spec` (a folder, hub id or builtin:) as `flavor`'s server serves it. `images` gives a tokenizer's
    image model (default: the flavor's, under no server kwargs). Raises TokenizerLoadError."""
    folder = Path(spec) if Path(spec).is_dir() else None
    renderer = renderer_for(flavor, folder, settings.tokenizer_mode)
    if renderer == MISTRAL and folder is not None:
        mistral = load_mistral(folder)
        identity = replace(load_mistral_identity(folder, mistral.file), renderer=MISTRAL)
        return ServedModel(
            identity,
            flavor,
            settings,
            MISTRAL,
            MistralEncoder(mistral),
            mistral=mistral,
            text_only=not _mistral_vision(folder),
        )
    loaded = load_tokenizer(spec, revision, chat_template_file, trust_remote_code)
    image_model = images or (lambda tok: image_model_for(flavor, tok))
    tok = flavored_tokenizer(loaded.tokenizer, flavor)
    encoder = best_encoder(tok, images=image_model(tok))
    processor = _processor_encoder(loaded, tok, folder, flavor, chat_template_file, image_model)
    source = tokenizer_template_source(folder, chat_template_file is not None)
    if processor is not None:  # the request's tools decide which of the two the server renders with
        source = f"{processor[1].source} (requests without tools), {source} (with tools)"
    identity = replace(loaded.identity, renderer=renderer, template_source=source)
    harmony = load_harmony(folder) if renderer == HARMONY and folder is not None else None
    return ServedModel(
        identity,
        flavor,
        settings,
        renderer,
        encoder,
        processor_encoder=processor[0] if processor else None,
        tokenizer=tok,
        harmony=harmony,
        # Harmony builds gpt-oss's prompt from the text alone and never asks the multimodal registry
        # (online_renderer.py _make_request_with_harmony): media parts are not refused there.
        text_only=flavor == "vllm" and renderer != HARMONY and _text_model(folder),
        model_type=model_type(folder),
    )


def _mistral_vision(folder: Path) -> bool:
    """A Mistral folder's params.json names its vision encoder (Pixtral, Mistral Small 3.1+), which vLLM's
    Mistral config reader turns into a multimodal model (`vllm/transformers_utils/configs/mistral.py`)."""
    try:
        params = json.loads((folder / "params.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(params, dict) and any(k in params for k in ("vision_encoder", "multimodal"))


def _text_model(folder: Path | None) -> bool:
    """A model folder (it has a config.json) without a processor: vLLM serves it without multimodal support.
    A bare tokenizer folder says nothing of the model, so nothing is refused for it."""
    if folder is None or not (folder / "config.json").is_file():
        return False
    return not any((folder / name).is_file() for name in PROCESSOR_FILES)


def _processor_encoder(
    loaded: LoadedTokenizer,
    tok: Any,
    folder: Path | None,
    flavor: str,
    chat_template_file: str | None,
    image_model: Callable[[Any], ImageModel | None],
) -> tuple[Encoder, Template] | None:
    """vLLM renders a request without tools with the processor's template, when the folder has one that
    differs from the tokenizer's and the server was given no --chat-template (core/templates.py)."""
    if flavor != "vllm" or folder is None or chat_template_file is not None:
        return None
    found = processor_template(folder)
    if found is None or found.text == loaded.tokenizer.chat_template:
        return None
    proc_tok = copy.copy(tok)
    proc_tok.chat_template = found.text
    return best_encoder(proc_tok, images=image_model(proc_tok)), found


def profile_of(model: ServedModel) -> DriftProfile:
    """The drift signatures of the model (core/diagnose.py). Served through mistral-common alone, they are
    mistral-common's: every prompt starts with BOS, written by the request format, no generation prompt."""
    if model.tokenizer is not None:
        return build_profile(model.tokenizer)
    bos = model.mistral.bos if model.mistral is not None else None
    return DriftProfile(
        has_template=True,
        plain_special_tokens=1,
        plain_adds_bos=True,
        template_emits_bos=True,
        generation_prompt_tokens=0,
        bos_text="<s>",
        bos_id=bos,
    )
