"""Image tokens for the Qwen2-VL family (proxy/core/images.py, vision.py), checked against transformers' own
image processor and PIL's full decode; the same rule against a real vLLM server is tests/vllm_vision.

transformers' `Qwen2VLImageProcessorPil` runs here without torch (its torchvision twin, the one vLLM
imports, shares `smart_resize`; tests/vllm_vision runs that one in the vLLM venv).
"""

from __future__ import annotations

import base64
import io
import struct
import zlib
from pathlib import Path
from typing import Any

import pytest
from PIL import Image, ImageOps

from proxy.core.count import count_request
from proxy.core.diagnose import MEDIA, build_profile, classify
from proxy.core.images import (
    COUNTED,
    UNMODELED,
    UNREADABLE,
    URL,
    ImageModel,
    ImageUnreadable,
    QwenVLRule,
    count_images,
    data_url_bytes,
    image_size,
)
from proxy.core.tokenizer import load_tokenizer
from proxy.core.tokens import render_chat
from proxy.core.vision import IMAGE_PAD, load_image_model, rule_from_config
from scripts.build_tiny_vl_model import preprocessor_config, write_processor_files
from tests.conftest import load_shared, shared_dir
from tests.lanes import sweep

# Small, odd, halfway rounding (70 -> 2.5 patches of 28 -> 2), extreme aspect ratios (200 is the processor's
# limit), under min_pixels, over max_pixels.
SIZES = [(28, 28), (10, 10), (70, 70), (42, 42), (98, 98), (1023, 769), (333, 500), (20, 150), (14, 2800),
         (2800, 14), (3, 600), (1920, 1080), (4480, 3000)]  # fmt: skip
LIMITS = [{}, {"max_pixels": 1003520}, {"min_pixels": 200000}, {"min_pixels": 100352, "max_pixels": 401408}]


@pytest.fixture(scope="module")
def vl_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What islwatch reads of the tiny Qwen2-VL model: the Qwen2.5 tokenizer files, Qwen2-VL's chat template
    and its preprocessor_config.json (scripts/build_tiny_vl_model.py, without the weights)."""
    folder = tmp_path_factory.mktemp("qwen2-vl")
    write_processor_files(shared_dir("qwen2.5-instruct"), folder, "qwen2_vl")
    return folder


@pytest.fixture(scope="module")
def vl_tok(vl_folder: Path) -> Any:
    return load_tokenizer(str(vl_folder)).tokenizer


def processor(folder: Path, **kwargs: Any) -> Any:
    transformers = pytest.importorskip("transformers")
    return transformers.AutoImageProcessor.from_pretrained(str(folder), **kwargs)


@pytest.mark.parametrize(
    "limits",
    # transformers' processor builds the images (~0.5 s of CPU a case): the fast lane runs the config's own limits
    sweep(LIMITS, ids=[",".join(f"{k}={v}" for k, v in d.items()) or "config" for d in LIMITS]),
)
def test_rule_equals_transformers_processor(vl_folder: Path, limits: dict[str, int]) -> None:
    proc = processor(vl_folder, **limits)
    rule = rule_from_config({**preprocessor_config("qwen2_vl"), **limits})
    assert rule is not None
    for width, height in SIZES:
        grid = proc(images=[Image.new("RGB", (width, height))], return_tensors="np")["image_grid_thw"]
        assert rule.tokens(width, height) == int(grid.prod()) // proc.merge_size**2, (width, height)


def test_halfway_rounds_to_even() -> None:
    """70 px is 2.5 units of 28: Python rounds to 2, so 70x70 is 56x56, 4 tokens (not 84x84, 9)."""
    assert QwenVLRule().tokens(70, 70) == 4
    assert QwenVLRule().tokens(126, 126) == 16  # 4.5 units -> 4


@pytest.mark.parametrize(
    "config",
    [
        {"min_pixels": 3136, "max_pixels": 12845056},
        {"size": {"shortest_edge": 6272, "longest_edge": 802816}},
        {"size": {"shortest_edge": 6272, "longest_edge": 802816}, "max_pixels": 401408},
        {},
    ],
    ids=["pixels", "size", "size-and-max", "class-defaults"],
)
def test_limits_read_as_transformers_reads_them(tmp_path: Path, config: dict[str, Any]) -> None:
    base = {k: v for k, v in preprocessor_config("qwen2_vl").items() if "pixels" not in k}
    (tmp_path / "preprocessor_config.json").write_text(__import__("json").dumps({**base, **config}))
    proc = processor(tmp_path)
    rule = rule_from_config({**base, **config})
    assert rule is not None
    assert (rule.min_pixels, rule.max_pixels) == (proc.size.shortest_edge, proc.size.longest_edge)
    assert (rule.patch_size, rule.merge_size) == (proc.patch_size, proc.merge_size)


def test_other_image_processors_have_no_rule() -> None:
    assert rule_from_config({"image_processor_type": "SiglipImageProcessor", "patch_size": 14}) is None
    assert (
        rule_from_config({"image_processor_type": "Qwen2VLImageProcessor", "size": {"longest_edge": 9}})
        is None
    )


# ---- sizes from encoded images ---------------------------------------------------------------------------


def encoded(fmt: str, size: tuple[int, int] = (37, 23), **save: Any) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, (200, 40, 90)).save(buf, fmt, **save)
    return buf.getvalue()


def png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def exif(orientation: int) -> bytes:
    e = Image.Exif()
    e[0x0112] = orientation
    return e.tobytes()


def before_iend(png: bytes, chunk: bytes) -> bytes:
    return png[:-12] + chunk + png[-12:]


def as_vllm_loads(raw: bytes) -> tuple[int, int]:
    """vLLM's image loader: PIL decodes, then `normalize_image` applies ImageOps.exif_transpose."""
    return ImageOps.exif_transpose(Image.open(io.BytesIO(raw))).size


PLAIN = {fmt.lower(): encoded(fmt) for fmt in ("PNG", "JPEG", "WEBP", "GIF", "BMP")}
ROTATED = {
    "jpeg-exif-rotate-90": encoded("JPEG", exif=exif(6)),
    "webp-exif-transpose": encoded("WEBP", exif=exif(5)),
    "png-exif-after-pixels": before_iend(encoded("PNG"), png_chunk(b"eXIf", exif(8)[6:])),
}


@pytest.mark.parametrize("name", list(PLAIN))
def test_size_is_what_vllm_loads(name: str) -> None:
    assert image_size(PLAIN[name]) == as_vllm_loads(PLAIN[name]) == (37, 23)


@pytest.mark.parametrize("name", list(ROTATED))
def test_orientation_cannot_change_the_count(name: str) -> None:
    """vLLM turns the image by its EXIF orientation; the header gives the stored size; same tokens."""
    stored, seen = image_size(ROTATED[name]), as_vllm_loads(ROTATED[name])
    assert seen == stored[::-1]  # not vacuous: vLLM does swap the sides
    assert QwenVLRule().tokens(*stored) == QwenVLRule().tokens(*seen)


@pytest.mark.parametrize(
    "limits", LIMITS, ids=lambda d: ",".join(f"{k}={v}" for k, v in d.items()) or "config"
)
def test_rule_is_symmetric(limits: dict[str, int]) -> None:
    rule = QwenVLRule(max_pixels=12845056).with_kwargs(limits)
    for width, height in [*SIZES, (1, 200), (333, 334), (56 * 45 + 13, 28 * 7 + 14)]:
        assert rule.tokens(width, height) == rule.tokens(height, width), (width, height)


def test_header_only_pixels_never_decoded() -> None:
    """A PNG whose pixel data is garbage: its size comes from the header (the decode would fail)."""
    png = encoded("PNG", (640, 480))
    start = png.index(b"IDAT") - 4
    length = struct.unpack(">I", png[start : start + 4])[0]
    broken = png[:start] + png_chunk(b"IDAT", b"\x00" * length) + png[start + 12 + length :]
    with pytest.raises(OSError):
        Image.open(io.BytesIO(broken)).load()
    assert image_size(broken) == (640, 480)


def ihdr_png(width: int, height: int) -> bytes:
    ihdr = png_chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
    return b"\x89PNG\r\n\x1a\n" + ihdr + png_chunk(b"IDAT", zlib.compress(b"")) + png_chunk(b"IEND", b"")


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"not an image",
        encoded("PNG")[:20],
        encoded("JPEG")[:40],
        encoded("TIFF"),
        ihdr_png(20000, 20000),
    ],
    ids=["empty", "garbage", "truncated-png", "truncated-jpeg", "tiff-not-sniffed", "over-vllm-pixel-limit"],
)
def test_unreadable_images_raise_one_error(raw: bytes) -> None:
    with pytest.raises(ImageUnreadable):
        image_size(raw)


@pytest.mark.parametrize(
    "url",
    [
        "data:image/png;base64,!!!!",
        "data:image/png,rawbytes",
        "data:image/png;base64",
        "data:;base64,iVBOR w==",
    ],
    ids=["bad-base64", "not-base64", "no-comma", "whitespace"],
)
def test_bad_data_urls(url: str) -> None:
    with pytest.raises(ImageUnreadable):
        data_url_bytes(url)


def data_url(size: tuple[int, int], fmt: str = "PNG") -> str:
    return f"data:image/{fmt.lower()};base64," + base64.b64encode(encoded(fmt, size)).decode()


# ---- one request's images --------------------------------------------------------------------------------

MODEL = ImageModel(QwenVLRule(min_pixels=3136, max_pixels=1003520))


def test_outcomes_of_each_kind_of_image() -> None:
    sources = [
        data_url((70, 70)),
        "https://example.com/a.png",
        "data:image/png;base64,AAAA",
        None,
        data_url((1, 250)),
    ]
    got = count_images(MODEL, sources, None)
    assert got.outcomes == {COUNTED: 1, URL: 1, UNREADABLE: 2, UNMODELED: 1}  # 1x250: aspect ratio over 200
    assert got.tokens == (4,)
    assert count_images(None, sources[:1], None).outcomes == {UNMODELED: 1}


def test_request_kwargs_count_only_when_the_server_trusts_them() -> None:
    kwargs = {"max_pixels": 50176}
    assert count_images(MODEL, [data_url((1400, 1400))], kwargs).outcomes == {UNMODELED: 1}  # vLLM: 400
    trusted = ImageModel(MODEL.rule, {"max_pixels": 1003520}, trust_request_kwargs=True)
    assert count_images(trusted, [data_url((1400, 1400))], kwargs).tokens == (
        QwenVLRule(max_pixels=50176).tokens(1400, 1400),
    )
    assert count_images(trusted, [data_url((1400, 1400))], {"do_resize": False}).outcomes == {UNMODELED: 1}


def chat(*parts: dict[str, Any], text: str = "What is in the picture?", **extra: Any) -> dict[str, Any]:
    return {
        "model": "m",
        "messages": [{"role": "user", "content": [*parts, {"type": "text", "text": text}]}],
        **extra,
    }


def image(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


def expanded_count(tok: Any, body: dict[str, Any], tokens: list[int]) -> int:
    """What vLLM's processor does: the rendered prompt with each `<|image_pad|>` repeated per its tokens."""
    from proxy.core.extract import chat_input

    rendered = render_chat(tok, chat_input(body, parts_format=True))
    pieces = rendered.split(IMAGE_PAD)
    assert len(pieces) == len(tokens) + 1
    text = pieces[0] + "".join(IMAGE_PAD * n + piece for n, piece in zip(tokens, pieces[1:], strict=True))
    return len(tok(text, add_special_tokens=False)["input_ids"])


def test_count_includes_image_tokens(vl_tok: Any) -> None:
    model = load_image_model(vl_tok)
    assert model is not None
    body = chat(image(data_url((640, 480))), image(data_url((70, 70), "JPEG")))
    result = count_request(vl_tok, "chat", body, model)
    want = [model.rule.tokens(640, 480), 4]
    assert result.image_tokens == tuple(want)
    assert result.templated == result.expected_server == expanded_count(vl_tok, body, want)
    assert result.unpredicted_media == 0
    profile = build_profile(vl_tok)
    assert classify(result, result.templated, profile) == "exact"
    assert classify(result, result.templated + 7, profile) != MEDIA  # predicted: the arithmetic applies


def test_unpredicted_images_stay_media(vl_tok: Any) -> None:
    model = load_image_model(vl_tok)
    body = chat(image(data_url((64, 64))), image("https://example.com/cat.png"))
    result = count_request(vl_tok, "chat", body, model)
    assert result.image_outcomes == {COUNTED: 1, URL: 1}
    assert result.unpredicted_media == 1
    assert classify(result, (result.templated or 0) + 100, build_profile(vl_tok)) == MEDIA


def test_server_kwargs_change_the_count(vl_tok: Any) -> None:
    body = chat(image(data_url((4480, 3000))))
    default = count_request(vl_tok, "chat", body, load_image_model(vl_tok))
    limited = count_request(vl_tok, "chat", body, load_image_model(vl_tok, {"max_pixels": 1003520}))
    assert default.image_tokens == (QwenVLRule(max_pixels=12845056).tokens(4480, 3000),)
    assert limited.image_tokens == (QwenVLRule(max_pixels=1003520).tokens(4480, 3000),)


def test_models_without_the_rule(tmp_path: Path, vl_folder: Path) -> None:
    assert load_image_model(load_shared("qwen2.5-instruct").tokenizer) is None  # no config
    text_template = tmp_path / "text-template"
    text_template.mkdir()
    for name in ("vocab.json", "merges.txt", "tokenizer_config.json"):
        (text_template / name).write_bytes((shared_dir("qwen2.5-instruct") / name).read_bytes())
    (text_template / "preprocessor_config.json").write_bytes(
        (vl_folder / "preprocessor_config.json").read_bytes()
    )
    # Qwen2.5's own template reads content as a string: vLLM would place the placeholders itself.
    assert load_image_model(load_tokenizer(str(text_template)).tokenizer) is None
    vl = load_tokenizer(str(vl_folder)).tokenizer
    assert load_image_model(vl, {"do_resize": False}) is None  # a server setting the rule does not model


def test_corrupt_image_is_counted_not_raised(vl_tok: Any) -> None:
    body = chat(image("data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n garbage").decode()))
    result = count_request(vl_tok, "chat", body, load_image_model(vl_tok))
    assert result.image_outcomes == {UNREADABLE: 1}
    assert result.templated is not None and result.unpredicted_media == 1
