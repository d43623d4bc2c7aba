"""One served model, prepared as its server prepares requests: the one place the counting path is assembled
(the proxy's workers, `islwatch count`, the tests).

The flavor (core/flavors/) says, by its server's rules: which renderer the model gets (core/renderers/),
which tokenizer and template the server runs (per request: the processor's or the tokenizer's), what it
counts and what it refuses. The server-wide settings it was started with: core/server_settings.py.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

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
from .endpoints import ANTHROPIC, Endpoint
from .extract import ChatInput, responses_as_chat
from .fast import best_encoder
from .flavors import Flavor, flavor_named
from .flavors.vllm import model_type
from .images import ImageModel
from .messages import REFUSES, InvalidBody
from .renderers import HARMONY, MISTRAL
from .renderers.harmony import HarmonyRenderer, load_harmony, server_date
from .renderers.mistral import MistralRenderer, load_mistral
from .renderers.mistral_request import MediaNotModelled
from .server_settings import DEFAULT_SETTINGS, ServerSettings
from .templates import Template, has_tools, processor_template, tokenizer_template_source
from .tokenizer import LoadedTokenizer, TokenizerIdentity, load_mistral_identity, load_tokenizer
from .vision import image_model_for

T = TypeVar("T")


@dataclass(frozen=True)
class ServedModel:
    identity: TokenizerIdentity
    flavor: Flavor
    settings: ServerSettings
    renderer: str
    encoder: Encoder  # the tokenizer's template; also the bare count for every renderer
    processor_encoder: Encoder | None = None  # the processor's template, for requests without tools
    tokenizer: Any = None  # the transformers tokenizer counted with (None: mistral-common only)
    harmony: HarmonyRenderer | None = None
    mistral: MistralRenderer | None = None
    text_only: bool = False  # the server serves the folder as a text model: media parts are refused
    model_type: str | None = None  # config.json's (SGLang keys a gpt-oss rule on it)
    probes: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)  # once(): per model

    def count(self, endpoint: str, body: Any, streamed: bool = False) -> CountResult:
        """What the server counts for this request. Never raises but on an islwatch bug (core/count.py).
        An Anthropic Messages request is the chat request the server converts it into (the flavor's rules),
        counted as that chat."""
        if endpoint in ANTHROPIC:
            try:
                chat = self.flavor.messages_as_chat(body, endpoint == Endpoint.COUNT_TOKENS, self)
            except InvalidBody as exc:
                return not_counted(endpoint, exc)
            return replace(self.count(Endpoint.CHAT, chat, streamed), endpoint=str(endpoint))
        result = self.flavor.reported(
            self._count(endpoint, body, streamed), endpoint, body, streamed, self.renderer
        )
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
        enc = self.encoder
        if self.processor_encoder is not None and (
            self.flavor.processor_template_with_tools or not has_tools(body)
        ):
            enc = self.processor_encoder
        return self.flavor.count(enc, endpoint, body, streamed, self.settings, self.model_type)

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

    # ServedTemplates (core/flavors/served.py): the server's own probes of its templates.
    def templates(self) -> list[str | None]:
        if self.harmony is not None or self.mistral is not None:
            return [None]
        return [(self.processor_encoder or self.encoder).template, self.encoder.template]

    def rendered(self, chat_body: dict[str, Any]) -> Any:
        try:
            if self.harmony is not None:
                date = server_date(self.settings.harmony_start_date)
                return tuple(self.harmony.harmony_chat_ids(chat_body, start_date=date))
            if self.mistral is not None:
                return tuple(self.mistral.chat_ids(chat_body))
            enc = self.processor_encoder or self.encoder  # a probe has no tools
            chat = parse(Endpoint.CHAT, chat_body, enc.parts_format, enc.developer_role, self.settings)
            assert isinstance(chat, ChatInput)
            return enc.render(chat)
        except Exception:  # the server's probe takes any failure to render as a refusal
            return None

    def once(self, key: str, compute: Callable[[], T]) -> T:
        if key not in self.probes:
            self.probes[key] = compute()
        value: T = self.probes[key]
        return value

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
    loaded: LoadedTokenizer | None = None,
) -> ServedModel:
    """Load `spec` (a folder, hub id or builtin:) as `flavor`'s server serves it. `images` gives a tokenizer's
    image model (default: the flavor's, under no server kwargs); `loaded`, `spec`'s tokenizer already loaded
    with the same revision and template file (not loaded again). Raises TokenizerLoadError."""
    folder = Path(spec) if Path(spec).is_dir() else None
    served = flavor_named(flavor)
    renderer = served.renderer(folder, settings)
    if renderer == MISTRAL and folder is not None:
        mistral = load_mistral(folder)
        identity = replace(load_mistral_identity(folder, mistral.file), renderer=MISTRAL)
        return ServedModel(
            identity,
            served,
            settings,
            MISTRAL,
            MistralEncoder(mistral),
            mistral=mistral,
            text_only=served.refuses_media(folder, MISTRAL),
        )
    loaded = loaded or load_tokenizer(spec, revision, chat_template_file, trust_remote_code)
    image_model = images or (lambda tok: image_model_for(flavor, tok))
    tok = served.served_tokenizer(loaded.tokenizer)
    encoder = best_encoder(tok, images=image_model(tok))
    processor = None
    if served.uses_processor_template(folder, chat_template_file) and folder is not None:
        processor = _processor_encoder(loaded, tok, folder, image_model)
    source = tokenizer_template_source(folder, chat_template_file is not None)
    if processor is not None and not served.processor_template_with_tools:
        # the request's tools decide which of the two the server renders with
        source = f"{processor[1].source} (requests without tools), {source} (with tools)"
    elif processor is not None:
        source = processor[1].source
    identity = replace(loaded.identity, renderer=renderer, template_source=source)
    harmony = load_harmony(folder) if renderer == HARMONY and folder is not None else None
    return ServedModel(
        identity,
        served,
        settings,
        renderer,
        encoder,
        processor_encoder=processor[0] if processor else None,
        tokenizer=tok,
        harmony=harmony,
        text_only=served.refuses_media(folder, renderer),
        model_type=model_type(folder),
    )


def _processor_encoder(
    loaded: LoadedTokenizer,
    tok: Any,
    folder: Path,
    image_model: Callable[[Any], ImageModel | None],
) -> tuple[Encoder, Template] | None:
    """The processor's template (core/templates.py), when the folder has one that differs from the
    tokenizer's: the flavor says which requests render with it."""
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
