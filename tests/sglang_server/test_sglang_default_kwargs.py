"""islwatch's `default_chat_template_kwargs` setting under the sglang flavor, against SGLang servers started with
`--default-chat-template-kwargs` (sglang_proc.DEFAULT_KWARGS): the server's keys fill what a request leaves out
(serving_chat.py `_process_messages`), after the request's own `reasoning_effort` was taken out of its kwargs
(`_convert_to_internal_request`), so a default effort wins over the request's, at the top level or in its
kwargs alike; a request's thinking switch (its own, or set by its `reasoning_effort`) wins over a default one.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import pytest

from proxy.core.fast import best_encoder
from proxy.core.server_settings import ServerSettings
from tests.conftest import load_shared
from tests.sglang_server.sglang_proc import DEFAULT_KWARGS, Oracle, Oracles
from tests.sglang_server.sglang_shapes import SHAPES, refused_by
from tests.sglang_server.test_sglang_shapes import assert_same_answer, islwatch_count, sglang_answer

pytestmark = pytest.mark.sglang

NAMES = (
    "system",
    "enable_thinking_true",
    "enable_thinking_false_with_history",
    "reasoning_effort_low",
    "reasoning_effort_none",
    "reasoning_object_enabled",
    "template_kwargs_effort_low",
    "template_kwargs_effort_none",  # gpt-oss: refused before the defaults apply
    "rc_thinking_true",
    "rc_agent_5_rounds_end_user",
)
DEFAULT_SHAPES = [s for s in SHAPES if s.name in NAMES]


@cache
def _encoder(family: str) -> Any:
    return best_encoder(load_shared(family).tokenizer)


@pytest.fixture(scope="session", params=list(DEFAULT_KWARGS))
def default_kwargs_oracle(all_oracles: Oracles, request: pytest.FixtureRequest) -> Oracle:
    return all_oracles.default_kwargs[request.param]


@pytest.mark.parametrize("shape", DEFAULT_SHAPES, ids=[s.name for s in DEFAULT_SHAPES])
def test_count_under_server_default_kwargs(default_kwargs_oracle: Oracle, shape: Any) -> None:
    oracle = default_kwargs_oracle
    settings = ServerSettings(default_chat_template_kwargs=oracle.default_kwargs)
    answer = sglang_answer(oracle, shape)
    result = islwatch_count(oracle, _encoder(oracle.family), shape.body, settings)
    assert_same_answer(answer, result, refused_by(oracle.family, shape))


def test_the_defaults_change_the_count(all_oracles: Oracles) -> None:
    """The servers with defaults count otherwise than the plain ones (the defaults reach the template)."""
    shape = next(s for s in SHAPES if s.name == "system")
    for family, oracle in all_oracles.default_kwargs.items():
        with_defaults = sglang_answer(oracle, shape)["input_ids"]
        plain = sglang_answer(all_oracles.plain[family], shape)["input_ids"]
        assert with_defaults != plain, family
