"""The `sglang` flavor through the proxy's own analysis (the worker's Analyzer, its spec crossing as JSON as it
does to a worker process): a request answered with SGLang's own count is `exact` under `server_flavor:
sglang`, where the default flavor calls the same answer a mismatch; one SGLang refuses (Gemma 3's template and
a developer turn) is a request the server refuses, not a count."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from proxy.server.analyzer import AnalysisSpec, Analyzer
from proxy.server.records import DEFAULT_KEY, AnalysisJob
from tests.sglang_server.sglang_proc import Oracle
from tests.sglang_server.sglang_shapes import SHAPES, refused_by

pytestmark = pytest.mark.sglang

DEPARTING = [s for s in SHAPES if s.name in ("tools_full", "developer_after_system")]


def analyzer(folder: str, flavor: str) -> Analyzer:
    spec = AnalysisSpec(((DEFAULT_KEY, folder),), server_flavor=flavor)
    return Analyzer.load(AnalysisSpec.from_json(spec.to_json()))


@pytest.mark.parametrize("shape", DEPARTING, ids=[s.name for s in DEPARTING])
def test_sglang_answer_is_exact_under_the_sglang_flavor(oracle: Oracle, shape: Any) -> None:
    answer = oracle.answer({**shape.body, "model": str(oracle.model_dir), "max_tokens": 1})
    raw = orjson.dumps({**shape.body, "model": "m"})
    folder = str(oracle.model_dir)
    if refused_by(oracle.family, shape):
        assert answer["status"] == 400, answer
        outcome = analyzer(folder, "sglang").analyze(AnalysisJob("chat", "m", DEFAULT_KEY, raw))
        assert outcome.bad_reason == "server_refuses", outcome
        return
    assert answer["status"] == 200, answer
    server = len(answer["input_ids"])
    usage = orjson.dumps({"usage": {"prompt_tokens": server, "completion_tokens": 1}})
    job = AnalysisJob("chat", "m", DEFAULT_KEY, raw, response_json=usage)
    sglang = analyzer(folder, "sglang").analyze(job)
    assert (sglang.match, sglang.expected, sglang.server) == ("exact", server, server)
    vllm = analyzer(folder, "vllm").analyze(job)
    if vllm.expected != server:  # where the template renders no tools, the two agree
        assert vllm.match == "mismatch"
