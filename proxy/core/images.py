"""Image tokens a vision-language server puts in place of each image, and image sizes read from data URLs.

Pure (bytes in, numbers out; no file or network I/O). Two parts:

- The Qwen2-VL / Qwen2.5-VL rule. vLLM 0.32 renders `<|vision_start|><|image_pad|><|vision_end|>` per image
  through the chat template, then replaces the one `<|image_pad|>` token with `grid_t * grid_h * grid_w //
  merge_size**2` copies, the grid being what transformers' `Qwen2VLImageProcessor` made of the image
  (`vllm/model_executor/models/qwen2_vl.py` `Qwen2VLMultiModalProcessor._get_prompt_updates`). The processor
  resizes each image with `smart_resize` (`transformers/models/qwen2_vl/image_processing_qwen2_vl.py`, copied
  below) to multiples of `patch_size * merge_size` within `min_pixels`/`max_pixels`; an image is one frame,
  padded to `temporal_patch_size` frames, so `grid_t` is 1. Qwen2.5-VL uses the same image processor.
- Image sizes from `data:` URLs: base64 decoded as vLLM decodes it (`vllm/multimodal/media/connector.py`
  `_load_data_url`, `pybase64.b64decode(validate=True)`), the header read by PIL without decoding pixels.

Other families with a deterministic rule (a fixed count per image, tiling) fit beside `QwenVLRule`, each
added only with a test against a real server.
"""

from __future__ import annotations

import base64
import binascii
import io
import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from PIL import Image

from .messages import MEDIA_KINDS

# Read by PIL's header parsers only: formats clients send. vLLM accepts more (vllm/multimodal/image.py
# ALLOWED_IMAGE_FORMATS); an image in another format is `unreadable` here, never guessed.
SNIFF_FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP")
MAX_DATA_URL_CHARS = 64 * 1024 * 1024  # bounded work: larger images are `unreadable` (the body cap is lower)
# The keys of mm_processor_kwargs (server flag or request field) that islwatch models; any other key in
# effect for images makes the request's images `unmodeled`. `videos_kwargs` does not touch images.
_SIZE_KEYS = frozenset({"min_pixels", "max_pixels", "size", "images_kwargs"})
_IGNORED_KEYS = frozenset({"videos_kwargs"})


class ImageUnreadable(ValueError):
    """The image's size could not be read (a corrupt image, a format not sniffed, too large)."""


class KwargsUnmodeled(ValueError):
    """mm_processor_kwargs that change the image processor in a way islwatch does not model."""


def smart_resize(
    height: int, width: int, factor: int = 28, min_pixels: int = 56 * 56, max_pixels: int = 14 * 14 * 4 * 1280
) -> tuple[int, int]:
    """transformers 5.19 `models/qwen2_vl/image_processing_qwen2_vl.py` `smart_resize`, which vLLM imports:
    both sides multiples of `factor`, the area within [min_pixels, max_pixels], the aspect ratio kept as
    closely as possible. `round` is Python's, half to even: a 70x70 image becomes 56x56 (4 tokens), not 84x84."""
    if max(height, width) / min(height, width) > 200:
        raise ValueError(
            f"absolute aspect ratio must be smaller than 200, got {max(height, width) / min(height, width)}"
        )
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


@dataclass(frozen=True)
class QwenVLRule:
    """The Qwen2-VL image processor's settings that decide the count (preprocessor_config.json, then the
    server's --mm-processor-kwargs, then a trusted request's mm_processor_kwargs)."""

    patch_size: int = 14
    merge_size: int = 2
    min_pixels: int = 56 * 56  # the processor's `size.shortest_edge`
    max_pixels: int = 28 * 28 * 1280  # `size.longest_edge`
    placeholder_tokens: int = 1  # the `<|image_pad|>` token the template renders once per image

    def tokens(self, width: int, height: int) -> int:
        """Tokens the server puts in place of one image of this size (raises ValueError past ratio 200)."""
        factor = self.patch_size * self.merge_size
        h, w = smart_resize(height, width, factor, self.min_pixels, self.max_pixels)
        return (h // self.patch_size) * (w // self.patch_size) // (self.merge_size**2)

    def with_kwargs(self, kwargs: Any) -> QwenVLRule:
        """These settings under mm_processor_kwargs (raises KwargsUnmodeled), as transformers'
        `Qwen2VLImageProcessor` resolves what vLLM passes it (`__init__` and `_standardize_kwargs`): a `size`
        {shortest_edge, longest_edge} replaces the limits, then `min_pixels` / `max_pixels` override them;
        keys scoped in `images_kwargs` win over flat ones. A None value overrides nothing. Measured on vLLM
        0.32: a request's `size` under a server's `max_pixels` keeps the server's `max_pixels`; a `size`
        with one edge is refused (400)."""
        if not kwargs:
            return self
        if not isinstance(kwargs, Mapping) or not set(kwargs) <= _SIZE_KEYS | _IGNORED_KEYS:
            raise KwargsUnmodeled("mm_processor_kwargs")
        scoped = kwargs.get("images_kwargs") or {}
        if not isinstance(scoped, Mapping) or not set(scoped) <= _SIZE_KEYS - {"images_kwargs"}:
            raise KwargsUnmodeled("images_kwargs")
        effective = {k: v for k, v in kwargs.items() if k in _SIZE_KEYS - {"images_kwargs"}}
        effective.update(scoped)
        low, high = self.min_pixels, self.max_pixels
        size = effective.get("size")
        if size is not None:
            if not isinstance(size, Mapping) or set(size) != {"shortest_edge", "longest_edge"}:
                raise KwargsUnmodeled("size")
            low, high = _pixels(size["shortest_edge"], low), _pixels(size["longest_edge"], high)
        low = _pixels(effective.get("min_pixels"), low)
        return replace(self, min_pixels=low, max_pixels=_pixels(effective.get("max_pixels"), high))


def merge_kwargs(configured: Mapping[str, Any], request: Mapping[str, Any]) -> dict[str, Any]:
    """vLLM `MultiModalConfig.merge_mm_processor_kwargs`: nested mappings merged recursively, the request's
    values winning over the server's --mm-processor-kwargs."""
    merged = dict(configured)
    for key, value in request.items():
        old = merged.get(key)
        both = isinstance(old, Mapping) and isinstance(value, Mapping)
        merged[key] = merge_kwargs(old, value) if both else value  # type: ignore[arg-type]
    return merged


def _pixels(value: Any, default: int) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise KwargsUnmodeled("pixels")
    return value


# ---- image sizes from data URLs --------------------------------------------------------------------------


def is_data_url(url: str) -> bool:
    """vLLM dispatches on `urlparse(url).scheme == "data"` (schemes are case-insensitive)."""
    return url[:5].lower() == "data:"


def data_url_bytes(url: str) -> bytes:
    """The image bytes of a base64 `data:` URL, decoded as vLLM decodes them (raises ImageUnreadable)."""
    if len(url) > MAX_DATA_URL_CHARS:
        raise ImageUnreadable("data URL too large")
    spec, sep, data = url[5:].partition(",")
    _, semi, encoding = spec.rpartition(";")
    if not sep or not semi or encoding != "base64":  # vLLM: "Only base64 data URLs are supported"
        raise ImageUnreadable("not a base64 data URL")
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ImageUnreadable("invalid base64") from exc


def image_size(raw: bytes) -> tuple[int, int]:
    """(width, height) of an encoded image, from its header only (PIL's `Image.open` reads no pixel data).

    vLLM turns images by their EXIF orientation (`vllm/multimodal/image.py` `normalize_image`), which swaps
    width and height for a 90° rotation; the Qwen2-VL rule is symmetric in the two (`smart_resize` treats
    both sides alike), so the stored size gives the same count."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(raw), formats=SNIFF_FORMATS) as im:
                width, height = im.size
    except Exception as exc:  # PIL raises OSError, SyntaxError, struct.error, ... on hostile input
        raise ImageUnreadable(type(exc).__name__) from exc
    if width <= 0 or height <= 0:
        raise ImageUnreadable("empty image")
    return width, height


# ---- one request's images ----------------------------------------------------------------------------------

# What became of each image of a request (islwatch_images_total{result}).
COUNTED = "counted"  # its tokens are part of the expected count
URL = "url"  # an http(s) (or file) URL: the sidecar does not fetch customer URLs
UNREADABLE = "unreadable"  # a data URL whose size could not be read (corrupt, unsupported format, too large)
UNMODELED = "unmodeled"  # no rule for this model, image embeddings, or mm_processor_kwargs not modelled
IMAGE_OUTCOMES = (COUNTED, URL, UNREADABLE, UNMODELED)


@dataclass(frozen=True)
class ImageModel:
    """What one served model's server does to images: the model's rule, the server's --mm-processor-kwargs
    (merged under each request's, as vLLM merges them), and whether the server takes per-request
    mm_processor_kwargs (--trust-request-mm-kwargs; without it vLLM answers 400 to a request carrying them)."""

    rule: QwenVLRule  # from preprocessor_config.json
    server_kwargs: Mapping[str, Any] = field(default_factory=dict)  # --mm-processor-kwargs (modelled ones)
    trust_request_kwargs: bool = False

    def rule_for(self, request_kwargs: Any) -> QwenVLRule | None:
        """The rule for a request carrying these mm_processor_kwargs; None when they cannot be modelled."""
        if request_kwargs and not self.trust_request_kwargs:
            # vLLM refuses them (400); answered, the server does trust them and islwatch's config lags.
            return None
        request = request_kwargs if isinstance(request_kwargs, Mapping) else {}
        if request_kwargs and not request:
            return None
        try:
            return self.rule.with_kwargs(merge_kwargs(self.server_kwargs, request))
        except KwargsUnmodeled:
            return None


@dataclass(frozen=True)
class ImageCount:
    tokens: tuple[int, ...] = ()  # per counted image, in request order
    outcomes: Mapping[str, int] = field(default_factory=dict)
    extra: int = 0  # tokens to add to the rendered prompt: each counted image's tokens minus its placeholder


def image_sources(messages: Sequence[Any]) -> tuple[str | None, ...]:
    """Each image part's URL, in request order, read as vLLM reads it (`vllm/renderers/chat_utils.py`
    `MM_PARSER_MAP`): `image_url.url` of an `image_url` part, the `image_url` string of an `input_image` part
    (Responses API), None for parts that carry none (`image_embeds`, a `file_id`)."""
    out: list[str | None] = []
    for msg in messages:
        content = msg.get("content") if isinstance(msg, Mapping) else None
        for part in content if isinstance(content, list) else ():
            kind = part.get("type") if isinstance(part, Mapping) else None
            if not isinstance(kind, str) or MEDIA_KINDS.get(kind) != "image":
                continue
            url = part.get("image_url")
            if kind == "image_url":
                url = url.get("url") if isinstance(url, Mapping) else None
            out.append(url if kind in ("image_url", "input_image") and isinstance(url, str) else None)
    return tuple(out)


def count_images(model: ImageModel | None, sources: Sequence[str | None], request_kwargs: Any) -> ImageCount:
    """The tokens of a request's images (`sources`: each image part's URL, None for parts without one).
    Never raises: what cannot be predicted is an outcome."""
    if not sources:
        return ImageCount()
    rule = model.rule_for(request_kwargs) if model is not None else None
    tokens: list[int] = []
    outcomes: dict[str, int] = {}
    for source in sources:
        outcome = _one_image(rule, source, tokens)
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    placeholders = rule.placeholder_tokens * len(tokens) if rule is not None else 0
    return ImageCount(tuple(tokens), outcomes, sum(tokens) - placeholders)


def _one_image(rule: QwenVLRule | None, source: str | None, tokens: list[int]) -> str:
    if rule is None or not isinstance(source, str):
        return UNMODELED
    if not is_data_url(source):
        return URL
    try:
        width, height = image_size(data_url_bytes(source))
        tokens.append(rule.tokens(width, height))
    except ValueError:  # ImageUnreadable, or an aspect ratio the processor refuses
        return UNREADABLE
    return COUNTED
