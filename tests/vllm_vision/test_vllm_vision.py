"""Image requests against a real vLLM 0.32 server serving a tiny Qwen2-VL model: islwatch's count (the
Qwen2-VL rule, proxy/core/images.py) equals the server's `usage.prompt_tokens` for every size of the table,
directly and through `islwatch proxy`; an image by http URL stays under the `media` cause. (The rule against
transformers' own image processor, size by size, is tests/core/test_image_tokens.py.)

The server runs with --mm-processor-kwargs '{"max_pixels": 1003520}' and --trust-request-mm-kwargs
(conftest.py); min_pixels (3136) comes from the model's preprocessor_config.json.
"""

from __future__ import annotations

import asyncio
import base64
import http.server
import io
import threading
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from PIL import Image

from loadgen.config import LoadgenConfig
from loadgen.send.runner import Engine
from loadgen.workload.conversations import Workload
from proxy.core.count import count_request
from proxy.core.images import COUNTED, URL, ImageModel
from proxy.core.usage import SSEUsageParser, usage_of
from tests.eventually import eventually
from tests.server.helpers import parse_metrics, value
from tests.vllm_server.vllm_proc import VllmServer, post, post_raw

pytestmark = pytest.mark.vllm
CHAT = "/v1/chat/completions"


@dataclass(frozen=True)
class Case:
    name: str
    images: tuple[tuple[int, int, str, int], ...]  # width, height, format, EXIF orientation (1: none)
    kwargs: dict[str, Any] = field(default_factory=dict)  # the request's mm_processor_kwargs


def one(width: int, height: int, fmt: str = "PNG", orientation: int = 1) -> tuple[int, int, str, int]:
    return (width, height, fmt, orientation)


CASES = [
    Case("28x28-one-unit", (one(28, 28),)),
    Case("10x10-under-min-pixels", (one(10, 10),)),
    Case("70x70-halfway-rounds-to-even", (one(70, 70),)),
    Case("1023x769-odd-jpeg", (one(1023, 769, "JPEG"),)),
    Case("14x2800-aspect-200", (one(14, 2800),)),
    Case("2800x14-aspect-200", (one(2800, 14, "WEBP"),)),
    Case("4480x3000-over-max-pixels", (one(4480, 3000),)),
    Case("300x100-jpeg-exif-rotated", (one(300, 100, "JPEG", 6),)),
    Case("two-images", (one(640, 480), one(70, 70, "GIF"))),
    Case("request-max-pixels-above-server", (one(1400, 1400),), {"max_pixels": 2007040}),
    Case("request-min-pixels", (one(100, 100),), {"min_pixels": 50000}),
    Case(
        "request-size-under-server-max-pixels",
        (one(1400, 1400),),
        {"size": {"shortest_edge": 3136, "longest_edge": 500000}},
    ),
    Case(
        "request-images-kwargs-win",
        (one(1400, 1400),),
        {"images_kwargs": {"max_pixels": 500000}, "max_pixels": 2007040},
    ),
]


def encode(width: int, height: int, fmt: str, orientation: int) -> bytes:
    buf = io.BytesIO()
    save: dict[str, Any] = {}
    if orientation != 1:
        exif = Image.Exif()
        exif[0x0112] = orientation
        save["exif"] = exif.tobytes()
    Image.new("RGB", (width, height), (30, 120, 200)).save(buf, fmt, **save)
    return buf.getvalue()


def data_url(width: int, height: int, fmt: str, orientation: int) -> str:
    raw = encode(width, height, fmt, orientation)
    return f"data:image/{fmt.lower()};base64,{base64.b64encode(raw).decode()}"


def body(
    server: VllmServer, urls: list[str], kwargs: dict[str, Any] | None = None, **extra: Any
) -> dict[str, Any]:
    parts: list[dict[str, Any]] = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    parts.append({"type": "text", "text": "What is in the picture?"})
    out: dict[str, Any] = {"model": server.model, "messages": [{"role": "user", "content": parts}]}
    out |= {"max_tokens": 1, "temperature": 0, **extra}
    if kwargs:
        out["mm_processor_kwargs"] = kwargs
    return out


def case_body(server: VllmServer, case: Case, **extra: Any) -> dict[str, Any]:
    return body(server, [data_url(*i) for i in case.images], case.kwargs, **extra)


def server_count(server: VllmServer, request: dict[str, Any]) -> int:
    status, answer = post(server.base_url, CHAT, request)
    assert status == 200, answer
    usage = usage_of(answer)
    assert usage is not None, answer
    return usage.input_tokens


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_direct_exact(vl_server: VllmServer, vl_tok: Any, vl_images: ImageModel, case: Case) -> None:
    request = case_body(vl_server, case)
    result = count_request(vl_tok, "chat", request, vl_images)
    assert result.image_outcomes == {COUNTED: len(case.images)}
    assert result.expected_server == server_count(vl_server, request)


def test_streamed_exact(vl_server: VllmServer, vl_tok: Any, vl_images: ImageModel) -> None:
    request = case_body(vl_server, CASES[8], stream=True, stream_options={"include_usage": True})
    status, raw = post_raw(vl_server.base_url, CHAT, request)
    assert status == 200, raw[:300]
    parser = SSEUsageParser()
    parser.feed(raw)
    usage = parser.result()
    assert usage is not None
    assert count_request(vl_tok, "chat", request, vl_images).expected_server == usage.input_tokens


def metrics(admin_url: str) -> dict[Any, float]:
    with urllib.request.urlopen(admin_url + "/metrics", timeout=30) as resp:
        return parse_metrics(resp.read().decode())


def through_proxy(
    proxy: tuple[str, str], request: dict[str, Any]
) -> tuple[dict[Any, float], dict[Any, float]]:
    """/metrics before and after one request through the proxy has been analysed."""
    url, admin_url = proxy
    before = metrics(admin_url)
    status, raw = post_raw(url, CHAT, request)
    assert status == 200, raw[:300]
    after = eventually(
        lambda: metrics(admin_url),
        until=lambda m: (
            value(m, "islwatch_isl_match_total") > value(before, "islwatch_isl_match_total")
            and value(m, "islwatch_analysis_queue_depth") == 0
        ),
        what="the analysis of the image request",
    )
    return before, after


def delta(before: dict[Any, float], after: dict[Any, float], name: str, **labels: str) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_through_the_proxy_exact(
    vl_server: VllmServer, vl_proxy: tuple[str, str], vl_tok: Any, vl_images: ImageModel, case: Case
) -> None:
    request = case_body(vl_server, case)
    before, after = through_proxy(vl_proxy, request)
    assert delta(before, after, "islwatch_isl_match_total", result="exact") == 1
    assert delta(before, after, "islwatch_drift_total", cause="exact") == 1
    assert delta(before, after, "islwatch_images_total", result="counted") == len(case.images)
    assert delta(before, after, "islwatch_images_per_request_sum") == len(case.images)
    tokens = sum(count_request(vl_tok, "chat", request, vl_images).image_tokens)
    assert delta(before, after, "islwatch_image_tokens_sum") == tokens


@pytest.fixture(scope="module")
def image_host() -> Iterator[str]:
    """A local HTTP server with one PNG: vLLM fetches http(s) image URLs, islwatch does not."""
    png = encode(300, 200, "PNG", 1)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.send_header("Content-Length", str(len(png)))
            self.end_headers()
            self.wfile.write(png)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/picture.png"
    server.shutdown()
    thread.join(10)


def test_url_image_stays_media(
    vl_server: VllmServer, vl_proxy: tuple[str, str], vl_tok: Any, vl_images: ImageModel, image_host: str
) -> None:
    request = body(vl_server, [image_host])
    result = count_request(vl_tok, "chat", request, vl_images)
    assert result.image_outcomes == {URL: 1}
    served = server_count(vl_server, request)
    # The server fetched and counted the 300x200 image; islwatch counted its one placeholder token.
    assert served - result.expected_server == vl_images.rule.tokens(300, 200) - 1  # type: ignore[operator]
    before, after = through_proxy(vl_proxy, request)
    assert delta(before, after, "islwatch_isl_match_total", result="mismatch") == 1
    assert delta(before, after, "islwatch_drift_total", cause="media") == 1
    assert delta(before, after, "islwatch_images_total", result="url") == 1


@pytest.mark.parametrize("via", ["direct", "proxy"])
def test_loadgen_images_budget_exact(
    vl_server: VllmServer, vl_proxy: tuple[str, str], vl_tok: Any, vl_images: ImageModel, via: str
) -> None:
    """`islwatch loadgen --images 1 --image-size 320x240 --turns 2`: every request's server count is its
    target, the image's tokens inside it (and the history's image again on turn 2)."""
    url = vl_server.base_url if via == "direct" else vl_proxy[0]
    cfg = LoadgenConfig(
        url=url, model=vl_server.model, isl=300, osl=2, ignore_eos=True, turns=2, concurrency=2, request_count=4,
        images=1, image_size="320x240", mm_processor_kwargs=dict(vl_images.server_kwargs),
    )  # fmt: skip
    before = metrics(vl_proxy[1])
    records = asyncio.run(Engine(cfg, Workload(vl_tok, cfg)).run())
    assert len(records) == 4
    for r in records:
        assert r.error is None and r.budget_error is None, r
        assert r.client_isl == r.target_isl == r.server_prompt_tokens, r
    if via == "proxy":
        after = eventually(
            lambda: metrics(vl_proxy[1]),
            until=lambda m: delta(before, m, "islwatch_isl_match_total") == 4,
            what="the analysis of the loadgen's requests",
        )
        assert delta(before, after, "islwatch_isl_match_total", result="exact") == 4
        assert delta(before, after, "islwatch_images_total", result="counted") == 4
