"""Generated images for `--images N --image-size WxH`: PNGs as data URLs in the first user message, counted
by the proxy's own rule (proxy/core/images.py), so the budget (text fitted around them) stays exact.

Each image is one solid colour drawn from the conversation's seeded generator: a few hundred bytes whatever
the size (the server's work depends on the size, not the pixels), and different per conversation, so a
server's multimodal cache does not serve a repeated image.
"""

from __future__ import annotations

import base64
import io
import random
from typing import Any

from PIL import Image

from proxy.core.images import ImageModel
from proxy.core.vision import load_image_model


def parse_size(text: str) -> tuple[int, int]:
    """`WxH` (e.g. 640x480) -> (width, height); raises ValueError."""
    width, sep, height = text.lower().partition("x")
    if not sep or not width.isdigit() or not height.isdigit() or int(width) < 1 or int(height) < 1:
        raise ValueError(f"image size must be WxH with positive integers (e.g. 640x480), got {text!r}")
    return int(width), int(height)


def png_data_url(width: int, height: int, rgb: tuple[int, int, int]) -> str:
    buf = io.BytesIO()
    Image.new("RGB", (width, height), rgb).save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def image_parts(n: int, size: tuple[int, int], rng: random.Random) -> list[dict[str, Any]]:
    """`n` chat content parts, each an `image_url` with a PNG data URL of `size`."""
    parts = []
    for _ in range(n):
        rgb = (rng.randrange(256), rng.randrange(256), rng.randrange(256))
        parts.append({"type": "image_url", "image_url": {"url": png_data_url(*size, rgb)}})
    return parts


def with_images(content: Any, parts: list[dict[str, Any]]) -> Any:
    """User content (a string or text parts) with the images in front of it."""
    if not parts:
        return content
    text = [{"type": "text", "text": content}] if isinstance(content, str) else list(content)
    return [*parts, *text]


def image_model(tok: Any, server_kwargs: dict[str, Any] | None) -> ImageModel:
    """The tokenizer's model's image rule, under the server's --mm-processor-kwargs; ValueError without one."""
    model = load_image_model(tok, server_kwargs)
    if model is None:
        raise ValueError(
            "--images needs a tokenizer folder of a model islwatch counts images for (a Qwen2-VL or "
            "Qwen2.5-VL folder with its preprocessor_config.json), and --mm-processor-kwargs of the kinds it "
            "models (min_pixels, max_pixels, size)"
        )
    return model
