"""islwatch's `sglang` flavor against SGLang 0.5.23's own chat preprocessing (the oracle: its request models,
`_validate_request` and `_convert_to_internal_request`, its template manager and tokenizer), every shape of
tests/sglang_server/sglang_shapes.py on each family: the count equals SGLang's `input_ids` length where
SGLang accepts the request, and islwatch says SGLang refuses it where SGLang does.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest
from sglang_proc import Oracle
from sglang_shapes import REFUSED_BY_SGLANG, SHAPES
from vllm_server.vllm_shapes import Shape

from proxy.core.count import SERVER_REFUSES, CountResult
from proxy.core.flavor import count_as
from tests.conftest import REPO, SHARED_TOKENIZERS

pytestmark = pytest.mark.sglang


def sglang_answer(oracle: Oracle, shape: Shape) -> dict[str, Any]:
    return oracle.answer({**shape.body, "model": str(oracle.model_dir), "max_tokens": 1})


@pytest.mark.parametrize("shape", SHAPES, ids=[s.name for s in SHAPES])
def test_count_equals_sglang_input_ids(oracle: Oracle, encoder: Any, shape: Shape) -> None:
    answer = sglang_answer(oracle, shape)
    result: CountResult = count_as("sglang", encoder, "chat", shape.body, False)
    if shape.name in REFUSED_BY_SGLANG:
        assert answer["status"] in (400, 500), answer
        assert result.fallback_reason == SERVER_REFUSES and result.expected_server is None, result
        assert result.detail is not None and result.detail.startswith("sglang answers 400: ")
    else:
        assert answer["status"] == 200, answer
        assert result.fallback_reason is None, result
        assert result.expected_server == len(answer["input_ids"])


def test_the_default_vllm_flavor_is_off_where_sglang_departs(oracle: Oracle, encoder: Any) -> None:
    """Why the flavor exists: vLLM's preparation of the same requests counts differently under SGLang (every
    tool dumped with one more field on Qwen2.5; a developer turn dropped by Qwen2.5's template, kept on
    Llama-3's; a request-level add_generation_prompt that SGLang does not read)."""
    names = {"tools_full", "developer_after_system", "generation_prompt_off"}
    differs = []
    for shape in (s for s in SHAPES if s.name in names):
        sglang = len(sglang_answer(oracle, shape)["input_ids"])
        vllm = count_as("vllm", encoder, "chat", shape.body, False).expected_server
        if vllm != sglang:
            differs.append(shape.name)
    expected = names if oracle.family.startswith("qwen") else names - {"tools_full"}  # Llama-3.0: no tools
    assert set(differs) == expected


CLI_SHAPES = [s for s in SHAPES if s.name in ("continue_final_message_spaces", "unknown_role")]


@pytest.mark.parametrize("shape", CLI_SHAPES, ids=[s.name for s in CLI_SHAPES])
def test_count_command_with_sglang_flavor(oracle: Oracle, shape: Shape) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "proxy.cli", "count", "--tokenizer", str(SHARED_TOKENIZERS / oracle.family),
         "--server-flavor", "sglang", "-"],
        input=json.dumps(shape.body), capture_output=True, text=True, cwd=REPO, check=False, timeout=300,
    )  # fmt: skip
    answer = sglang_answer(oracle, shape)
    if answer["status"] == 200:
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["expected_server"] == len(answer["input_ids"])
    else:  # SGLang refuses it: islwatch says so, and counts nothing
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout)
        assert out["server_would_refuse"] is True and out["expected_server"] is None
        assert "sglang answers 400" in proc.stderr


def test_the_oracle_is_the_tested_version(oracle: Oracle) -> None:
    """The flavor is pinned to the version tested (README, "Tested against SGLang")."""
    from proxy.core.specs import TESTED_VERSIONS

    assert oracle.version == TESTED_VERSIONS["sglang"]
