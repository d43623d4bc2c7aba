"""`--images N --image-size WxH`: generated PNGs in the first user message, their tokens inside the exact
budget (the real-server run of the same is tests/vllm_vision)."""

from __future__ import annotations

import base64
import io
from pathlib import Path
from typing import Any

import pytest
from PIL import Image
from pydantic import ValidationError

from loadgen.config import LoadgenConfig
from loadgen.workload.conversations import Workload
from loadgen.workload.images import parse_size
from proxy.core.images import QwenVLRule
from proxy.core.tokenizer import load_tokenizer
from scripts.build_tiny_vl_model import write_processor_files
from tests.conftest import load_shared, shared_dir


@pytest.fixture(scope="module")
def vl_tok(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The tiny Qwen2-VL model's tokenizer side (scripts/build_tiny_vl_model.py, without the weights)."""
    folder: Path = tmp_path_factory.mktemp("qwen2-vl")
    write_processor_files(shared_dir("qwen2.5-instruct"), folder, "qwen2_vl")
    return load_tokenizer(str(folder)).tokenizer


def config(**kw: Any) -> LoadgenConfig:
    base = {"url": "http://127.0.0.1:1", "isl": 400, "concurrency": 1, "request_count": 4}
    return LoadgenConfig(**{**base, **kw})


def sizes_sent(body: dict[str, Any]) -> list[tuple[int, int]]:
    parts = [p for m in body["messages"] for p in m["content"] if isinstance(m["content"], list)]
    urls = [p["image_url"]["url"] for p in parts if p["type"] == "image_url"]
    return [Image.open(io.BytesIO(base64.b64decode(u.split(",", 1)[1]))).size for u in urls]


@pytest.mark.parametrize("kw", [{}, {"cache_bust": "first_turn_prefix"}, {"content_parts": True}])
def test_budget_exact_with_images(vl_tok: Any, kw: dict[str, Any]) -> None:
    cfg = config(images=2, image_size="320x240", **kw)
    work = Workload(vl_tok, cfg)
    for i in range(3):
        _, req = work.start(f"c{i}")
        assert req.error is None, req.error
        assert req.client_isl == req.target_isl == 400
        assert sizes_sent(req.body) == [(320, 240), (320, 240)]
    # The images are inside the budget: the text is what is left of 400 after their tokens (2 x 99).
    without = Workload(vl_tok, config(**kw)).start("c0")[1]
    assert words(without.body) - words(req.body) > 150


def words(body: dict[str, Any]) -> int:
    content = body["messages"][-1]["content"]
    texts = [content] if isinstance(content, str) else [p["text"] for p in content if p["type"] == "text"]
    return sum(len(t.split()) for t in texts)


def test_server_limits_change_the_text_budget(vl_tok: Any) -> None:
    """With the server's max_pixels lower, the same image costs fewer tokens and more text fits."""
    big = "1792x1344"
    plain = Workload(vl_tok, config(images=1, image_size=big, isl=3500)).start("c")[1]
    limited = Workload(
        vl_tok, config(images=1, image_size=big, isl=3500, mm_processor_kwargs={"max_pixels": 401408})
    ).start("c")[1]
    assert plain.error is None and limited.error is None
    assert QwenVLRule(max_pixels=401408).tokens(1792, 1344) < QwenVLRule(max_pixels=12845056).tokens(
        1792, 1344
    )
    text = [len(r.body["messages"][0]["content"][-1]["text"]) for r in (plain, limited)]
    assert text[1] > text[0]


def test_images_need_a_model_with_the_rule() -> None:
    with pytest.raises(ValueError, match="--images needs"):
        Workload(load_shared("qwen2.5-instruct").tokenizer, config(images=1))


@pytest.mark.parametrize(
    "kw",
    [{"endpoint": "completions"}, {"image_size": "64"}, {"images": -1}],
    ids=["completions", "size", "count"],
)
def test_bad_image_options_refused(kw: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        config(images=kw.pop("images", 1), **kw)


def test_parse_size() -> None:
    assert parse_size("640x480") == (640, 480)
    assert parse_size("10X20") == (10, 20)
    for bad in ("640", "0x10", "ax1", "10x"):
        with pytest.raises(ValueError):
            parse_size(bad)
