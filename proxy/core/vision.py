"""Which image rule a served model follows, read from its `preprocessor_config.json` (the file transformers'
`AutoImageProcessor` and vLLM's `cached_processor_from_config` read), then checked on the tokenizer.

A model gets an `ImageModel` only when every fact the count rests on holds at load:
- the image processor is transformers' `Qwen2VLImageProcessor` (Qwen2-VL, Qwen2.5-VL: `image_processor_type`,
  or its Fast/Pil variants), with `patch_size`, `merge_size` and the size limits as that class reads them
  (`__init__`: `size` {shortest_edge, longest_edge}, then `min_pixels` / `max_pixels` override it);
- the chat template takes messages as part lists and renders one image part as exactly one `<|image_pad|>`,
  a single token, which vLLM replaces (`Qwen2VLMultiModalProcessor._get_prompt_updates`);
- the server's --mm-processor-kwargs are of the kinds `QwenVLRule.with_kwargs` models.
Anything else: None, and the request's images stay under the `media` cause.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .flavors import flavor_named
from .images import ImageModel, KwargsUnmodeled, QwenVLRule
from .tokens import parts_format, render_messages

PREPROCESSOR_CONFIG = "preprocessor_config.json"
QWEN2_VL_PROCESSORS = ("Qwen2VLImageProcessor", "Qwen2VLImageProcessorFast", "Qwen2VLImageProcessorPil")
IMAGE_PAD = "<|image_pad|>"  # Qwen2VLProcessor.image_token
_PROBE = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "hello"}]}]


def preprocessor_config_path(tok: Any) -> Path | None:
    """The tokenizer's folder's preprocessor_config.json, or the hub cache's copy for a hub id (offline)."""
    name = getattr(tok, "name_or_path", None)
    if not isinstance(name, str) or not name:
        return None
    if os.path.isdir(name):
        path = Path(name) / PREPROCESSOR_CONFIG
        return path if path.is_file() else None
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(name, PREPROCESSOR_CONFIG)
    except Exception:  # not a hub id, or an unreadable cache: no image rule
        return None
    return Path(found) if isinstance(found, str) else None


def rule_from_config(config: Any) -> QwenVLRule | None:
    """The Qwen2-VL rule of a preprocessor_config.json, None for any other image processor."""
    if not isinstance(config, Mapping) or config.get("image_processor_type") not in QWEN2_VL_PROCESSORS:
        return None
    patch, merge = config.get("patch_size", 14), config.get("merge_size", 2)
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (patch, merge)):
        return None
    keys = ("size", "min_pixels", "max_pixels")
    try:
        return QwenVLRule(patch_size=patch, merge_size=merge).with_kwargs(
            {k: config[k] for k in keys if k in config}
        )
    except KwargsUnmodeled:
        return None


def renders_one_placeholder(tok: Any) -> bool:
    """The template renders an image part as one `<|image_pad|>`, and the tokenizer keeps it one token."""
    try:
        ids = tok(IMAGE_PAD, add_special_tokens=False)["input_ids"]
        rendered = render_messages(tok, _PROBE)
    except Exception:  # a template that refuses the probe: no image rule
        return False
    return parts_format(tok) and len(ids) == 1 and rendered.count(IMAGE_PAD) == 1


def image_model_for(
    flavor: str, tok: Any, server_kwargs: Mapping[str, Any] | None = None, trust_request_kwargs: bool = False
) -> ImageModel | None:
    """The flavor's server's image rule: vLLM's Qwen2-VL processing is the one tested against a real server."""
    if not flavor_named(flavor).counts_images:
        return None
    return load_image_model(tok, server_kwargs, trust_request_kwargs)


def load_image_model(
    tok: Any, server_kwargs: Mapping[str, Any] | None = None, trust_request_kwargs: bool = False
) -> ImageModel | None:
    """The image rule of the model `tok` belongs to, under the server's --mm-processor-kwargs."""
    path = preprocessor_config_path(tok)
    if path is None:
        return None
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    rule = rule_from_config(config)
    if rule is None or not renders_one_placeholder(tok):
        return None
    server = dict(server_kwargs or {})
    try:
        rule.with_kwargs(server)  # every key of the server's flag must be one the rule models
    except KwargsUnmodeled:
        return None
    return ImageModel(rule, server, trust_request_kwargs)
