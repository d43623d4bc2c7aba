"""The `sglang` flavor through the proxy's own analysis (the worker's Analyzer, its spec crossing as JSON as it
does to a worker process): a request answered with SGLang's own count is `exact` under `server_flavor:
sglang`, where the default flavor calls the same answer a mismatch."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from sglang_proc import Oracle
from sglang_shapes import SHAPES

from proxy.server.analyzer import AnalysisSpec, Analyzer
from proxy.server.records import DEFAULT_KEY, AnalysisJob

pytestmark = pytest.mark.sglang

DEPARTING = [s for s in SHAPES if s.name in ("tools_full", "developer_after_system")]


def analyzer(folder: str, flavor: str) -> Analyzer:
    spec = AnalysisSpec(((DEFAULT_KEY, folder),), server_flavor=flavor)
    return Analyzer.load(AnalysisSpec.from_json(spec.to_json()))


@pytest.mark.parametrize("shape", DEPARTING, ids=[s.name for s in DEPARTING])
def test_sglang_answer_is_exact_under_the_sglang_flavor(oracle: Oracle, shape: Any) -> None:
    answer = oracle.answer({**shape.body, "model": str(oracle.model_dir), "max_tokens": 1})
    assert answer["status"] == 200, answer
    server = len(answer["input_ids"])
    raw = orjson.dumps({**shape.body, "model": "m"})
    usage = orjson.dumps({"usage": {"prompt_tokens": server, "completion_tokens": 1}})
    job = AnalysisJob("chat", "m", DEFAULT_KEY, raw, response_json=usage)
    folder = str(oracle.model_dir)
    sglang = analyzer(folder, "sglang").analyze(job)
    assert (sglang.match, sglang.expected, sglang.server) == ("exact", server, server)
    vllm = analyzer(folder, "vllm").analyze(job)
    if vllm.expected != server:  # Llama-3.0's template renders no tools: there the two agree
        assert vllm.match == "mismatch"
