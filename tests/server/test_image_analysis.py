"""Images through the analysis: the server's settings reach the worker, each image's outcome and tokens come
back over the pipe framing, and the metrics count them (the real vLLM server run is tests/vllm_vision)."""

from __future__ import annotations

import base64
import io
import logging
from pathlib import Path
from typing import Any

import orjson
import pytest
from PIL import Image
from prometheus_client import CollectorRegistry

from proxy.core.images import QwenVLRule
from proxy.server.analyzer import AnalysisSpec, Analyzer
from proxy.server.frames import decode_outcome, encode_outcome
from proxy.server.metrics import build_metrics
from proxy.server.problems import ProblemLog
from proxy.server.records import DEFAULT_KEY, AnalysisJob
from scripts.build_tiny_vl_model import write_processor_files
from tests.conftest import shared_dir
from tests.server.helpers import parse_metrics, value

SERVER_KWARGS = {"max_pixels": 1003520}


@pytest.fixture(scope="module")
def vl_folder(tmp_path_factory: pytest.TempPathFactory) -> str:
    folder: Path = tmp_path_factory.mktemp("qwen2-vl")
    write_processor_files(shared_dir("qwen2.5-instruct"), folder, "qwen2_vl")
    return str(folder)


def png(width: int, height: int) -> str:
    buf = io.BytesIO()
    Image.new("RGB", (width, height)).save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def job(parts: list[dict[str, Any]], server: int, **body: Any) -> AnalysisJob:
    msg = {"role": "user", "content": [*parts, {"type": "text", "text": "What is this?"}]}
    raw = orjson.dumps({"model": "m", "messages": [msg], **body})
    usage = orjson.dumps({"usage": {"prompt_tokens": server, "completion_tokens": 1}})
    return AnalysisJob("chat", "m", DEFAULT_KEY, raw, response_json=usage)


def image(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


def analyzer(folder: str, **spec: Any) -> Analyzer:
    # Crossing as JSON, as it does to a worker process.
    return Analyzer.load(AnalysisSpec.from_json(AnalysisSpec(((DEFAULT_KEY, folder),), **spec).to_json()))


def test_images_counted_with_the_servers_settings(vl_folder: str) -> None:
    a = analyzer(vl_folder, mm_processor_kwargs=SERVER_KWARGS, trust_request_mm_kwargs=True)
    probe = a.analyze(job([image(png(4480, 3000)), image(png(70, 70))], server=0))
    tokens = QwenVLRule(max_pixels=1003520).tokens(4480, 3000) + 4
    assert probe.images == {"counted": 2} and probe.image_tokens == tokens
    assert probe.expected is not None
    exact = a.analyze(job([image(png(4480, 3000)), image(png(70, 70))], server=probe.expected))
    assert (exact.match, exact.cause) == ("exact", "exact")
    # A trusted request's own limit changes the count.
    limited = a.analyze(job([image(png(4480, 3000))], server=0, mm_processor_kwargs={"max_pixels": 200704}))
    assert limited.image_tokens == QwenVLRule(max_pixels=200704).tokens(4480, 3000)
    roundtrip = decode_outcome(orjson.loads(encode_outcome(exact)))
    assert roundtrip == exact


def test_untrusted_request_kwargs_and_urls_stay_media(vl_folder: str) -> None:
    a = analyzer(vl_folder)
    kw = a.analyze(job([image(png(64, 64))], server=999, mm_processor_kwargs={"max_pixels": 200704}))
    assert kw.images == {"unmodeled": 1} and kw.image_tokens is None and kw.cause == "media"
    url = a.analyze(job([image("https://example.com/x.png"), image(png(64, 64))], server=999))
    assert url.images == {"url": 1, "counted": 1} and url.image_tokens is None and url.cause == "media"


def test_llama_cpp_flavor_counts_no_image(vl_folder: str) -> None:
    """Only vLLM's processing is tested against a server: another flavor leaves images unmodelled."""
    out = analyzer(vl_folder, server_flavor="llama.cpp").analyze(job([image(png(64, 64))], server=999))
    assert out.images == {"unmodeled": 1}


def test_metrics_count_images_and_unreadable_ones(vl_folder: str, caplog: pytest.LogCaptureFixture) -> None:
    a = analyzer(vl_folder, mm_processor_kwargs=SERVER_KWARGS)
    metrics = build_metrics(CollectorRegistry(), process_metrics=False)
    problems = ProblemLog(logging.getLogger("test_image_analysis"))
    corrupt = "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\nnot really").decode()
    for parts in ([image(png(640, 480))], [image(png(70, 70)), image(corrupt)]):
        metrics.analysed(a.analyze(job(parts, server=500)), problems)
    samples = parse_metrics(_exposition(metrics.registry))
    assert value(samples, "islwatch_images_total", result="counted") == 2
    assert value(samples, "islwatch_images_total", result="unreadable") == 1
    assert value(samples, "islwatch_images_per_request_sum") == 3
    assert value(samples, "islwatch_image_tokens_count") == 1  # only the request whose images all counted
    assert value(samples, "islwatch_image_tokens_sum") == QwenVLRule(max_pixels=1003520).tokens(640, 480)
    assert "an image's size could not be read" in caplog.text
    assert "not really" not in caplog.text


def _exposition(registry: CollectorRegistry) -> str:
    from prometheus_client import generate_latest

    return generate_latest(registry).decode()
