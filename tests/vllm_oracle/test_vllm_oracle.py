"""islwatch's count against vLLM 0.32's own request preprocessing (the oracle: vLLM's request models, its
renderer for the folder, the OnlineRenderer and the render server's request path; tests/vllm_oracle), every
shape of oracle_shapes.py on every family: where vLLM answers, islwatch's count is the length of vLLM's
prompt token ids; where vLLM refuses the request, islwatch says so.
"""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from proxy.core.count import INVALID_BODY, SERVER_REFUSES, TEMPLATE_ERROR, CountResult
from proxy.core.model import ServedModel, load_served_model
from proxy.core.server_settings import ServerSettings
from proxy.core.specs import TESTED_VERSIONS
from tests.vllm_oracle.oracle_proc import Oracle
from tests.vllm_oracle.oracle_shapes import SHAPES
from tests.vllm_server.vllm_shapes import Shape

pytestmark = pytest.mark.vllm
REFUSALS_5XX = (TEMPLATE_ERROR, SERVER_REFUSES, INVALID_BODY)
START_DATE = os.environ.get("VLLM_SYSTEM_START_DATE")


@cache
def _served(folder: str) -> ServedModel:
    # The oracles' environment passes VLLM_SYSTEM_START_DATE through (oracle_proc.launch): the same date here.
    return load_served_model(folder, "vllm", ServerSettings(harmony_start_date=START_DATE))


def islwatch_count(folder: Path, endpoint: str, body: dict[str, Any]) -> CountResult:
    """islwatch's public counting API on the folder vLLM serves (the one line to change when it moves)."""
    return _served(str(folder)).count(endpoint, body, False)


def request_body(oracle: Oracle, shape: Shape) -> dict[str, Any]:
    """The shape as a client sends it: the served model's name, a small output limit."""
    limit = {"max_output_tokens": 16} if shape.endpoint == "responses" else {"max_tokens": 1}
    return {**shape.body, "model": str(oracle.model_dir), **limit}


def assert_as_vllm(result: CountResult, answer: dict[str, Any]) -> None:
    """islwatch's count is the length of vLLM's prompt ids where vLLM answers, a refusal where it refuses."""
    if answer["status"] == 200:
        vllm = sum(len(ids) for ids in answer["prompts"])
        assert result.fallback_reason is None, (
            f"vLLM counts {vllm}; islwatch: {result.fallback_reason} ({result.detail})"
        )
        assert result.expected_server == vllm, f"islwatch {result.expected_server}, vLLM {vllm}"
    else:  # a 400 is what `islwatch count` calls server_would_refuse; vLLM's 500s are counted as invalid
        refusals = (TEMPLATE_ERROR, SERVER_REFUSES) if answer["status"] < 500 else REFUSALS_5XX
        assert result.fallback_reason in refusals, (
            f"vLLM answers {answer['status']} ({answer['error'][:160]}); islwatch counts "
            f"{result.expected_server} ({result.fallback_reason}: {result.detail})"
        )


@pytest.mark.parametrize("shape", SHAPES, ids=[s.name for s in SHAPES])
def test_count_equals_vllm_prompt(oracle: Oracle, shape: Shape) -> None:
    body = request_body(oracle, shape)
    answer = oracle.answer(shape.endpoint, body)
    result = islwatch_count(oracle.model_dir, shape.endpoint, body)
    assert_as_vllm(result, answer)


def test_the_oracle_is_the_tested_version(oracles: dict[str, Oracle], release: str) -> None:
    """Each release's oracles run the version proxy.core.specs.TESTED_VERSIONS names
    (docs/compatibility/vllm.md): the vllm flavor's 0.32, and the newer release it is also checked against."""
    assert {o.version for o in oracles.values()} == {TESTED_VERSIONS[release]}
