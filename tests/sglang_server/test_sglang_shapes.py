"""islwatch's `sglang` flavor against SGLang 0.5.23's own chat preprocessing (the oracle: its request models,
`_validate_request` and `_convert_to_internal_request`, its template manager and tokenizer), every shape of
tests/sglang_server/sglang_shapes.py on each family: the count equals SGLang's `input_ids` length where
SGLang accepts the request, and islwatch says SGLang refuses it where SGLang does (`refused_by`). The one
divergence kept on purpose (`DIVERGES`) is asserted as such.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from proxy.core.count import SERVER_REFUSES, CountResult
from proxy.core.flavors import flavor_named
from proxy.core.server_settings import DEFAULT_SETTINGS, ServerSettings
from tests.conftest import REPO, TEST_TOKENIZERS
from tests.sglang_server.sglang_proc import Oracle
from tests.sglang_server.sglang_shapes import DIVERGES, SHAPES, refused_by
from tests.vllm_server.vllm_shapes import Shape

pytestmark = pytest.mark.sglang


def sglang_answer(oracle: Oracle, shape: Shape) -> dict[str, Any]:
    return oracle.answer({**shape.body, "model": str(oracle.model_dir), "max_tokens": 1})


def model_type(folder: Path) -> str | None:
    value = json.loads((folder / "config.json").read_text()).get("model_type")
    return value if isinstance(value, str) else None


def islwatch_count(
    oracle: Oracle, encoder: Any, body: dict[str, Any], settings: ServerSettings = DEFAULT_SETTINGS
) -> CountResult:
    """The sglang flavor's count with what the served model knows: the server's settings and the folder's
    `model_type`."""
    return flavor_named("sglang").count(encoder, "chat", body, False, settings, model_type(oracle.model_dir))


def assert_same_answer(answer: dict[str, Any], result: CountResult, refused: bool) -> None:
    if refused:
        assert answer["status"] in (400, 500), answer
        assert result.fallback_reason == SERVER_REFUSES and result.expected_server is None, result
        assert result.detail is not None and result.detail.startswith("sglang answers 400: ")
    else:
        assert answer["status"] == 200, answer
        assert result.fallback_reason is None, result
        assert result.expected_server == len(answer["input_ids"])


@pytest.mark.parametrize("shape", SHAPES, ids=[s.name for s in SHAPES])
def test_count_equals_sglang_input_ids(oracle: Oracle, encoder: Any, shape: Shape) -> None:
    answer = sglang_answer(oracle, shape)
    result = islwatch_count(oracle, encoder, shape.body)
    if (oracle.family, shape.name) in DIVERGES:  # SGLang refuses; islwatch counts (the reason in DIVERGES)
        assert answer["status"] == 400, answer
        assert result.fallback_reason is None and result.expected_server is not None, result
        return
    assert_same_answer(answer, result, refused_by(oracle.family, shape))


# Where vLLM's preparation of a request counts otherwise than SGLang's, by family: every tool dumped with one
# more field (templates that dump tools as JSON: Qwen, Llama 3.1; gpt-oss writes TypeScript, the others render
# no tools); a developer turn dropped or kept by a template that does not know the role, where vLLM makes it a
# system turn (Gemma 3's template refuses it outright); a request-level add_generation_prompt SGLang does not
# read (everywhere).
DEPARTS = {
    "qwen2.5-instruct": {"tools_full", "developer_after_system", "generation_prompt_off"},
    "llama-3-8b-instruct": {"developer_after_system", "generation_prompt_off"},
    "qwen3": {"tools_full", "developer_after_system", "generation_prompt_off"},
    "llama-3.1": {"tools_full", "developer_after_system", "generation_prompt_off"},
    "gemma-3": {"developer_after_system", "generation_prompt_off"},
    "gpt-oss": {"generation_prompt_off"},
    "deepseek-r1": {"developer_after_system", "generation_prompt_off"},
}


def test_the_default_vllm_flavor_is_off_where_sglang_departs(oracle: Oracle, encoder: Any) -> None:
    """Why the flavor exists: vLLM's preparation of the same requests counts differently under SGLang."""
    differs = set()
    for shape in (
        s for s in SHAPES if s.name in {"tools_full", "developer_after_system", "generation_prompt_off"}
    ):
        answer = sglang_answer(oracle, shape)
        sglang = len(answer["input_ids"]) if answer["status"] == 200 else None
        if flavor_named("vllm").count(encoder, "chat", shape.body).expected_server != sglang:
            differs.add(shape.name)
    assert differs == DEPARTS[oracle.family]


CLI_SHAPES = [s for s in SHAPES if s.name in ("continue_final_message_spaces", "unknown_role")]
# The command's plumbing, once (a process start each): the flavor is checked on all the shapes above.
CLI_FAMILY = "qwen3"


@pytest.mark.parametrize("shape", CLI_SHAPES, ids=[s.name for s in CLI_SHAPES])
def test_count_command_with_sglang_flavor(oracles: dict[str, Oracle], shape: Shape) -> None:
    oracle = oracles[CLI_FAMILY]
    proc = subprocess.run(
        [sys.executable, "-m", "proxy.cli", "count", "--tokenizer", str(TEST_TOKENIZERS / oracle.family),
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
