"""Where vLLM 0.33 prepares a request otherwise than 0.32 (the release the vllm flavor models): each request
is put to both releases' oracles and each release's own answer is asserted, so a divergence is stated, never
skipped. Every shape of oracle_shapes.py on every family answers alike on both (the same token ids and the
same errors: 1,260 of 1,260, compared once); the requests below are the ones that differ, found by reading
0.33's source against 0.32's and then put to both. None changes how a prompt is rendered; they change which
requests are refused, and where a prompt is cut:

- `skip_special_tokens: null`: 0.32's request models take a bool (null is a 400); 0.33's take `bool | None`
  (None: the model's generation config, else true). Chat, completions and responses `protocol.py`.
- Responses `prompt_cache_retention`, `prompt_cache_options`, `safety_identifier`: 0.32 ignores them as unknown
  fields; 0.33 types them, so a value outside the type is a 400 (`responses/protocol.py`; "in-memory" is
  normalised to "in_memory").
- Truncation to the context without an output limit (chat `truncate_prompt_tokens: -1`, responses
  `truncation: "auto"`): 0.32 cuts the prompt to max_model_len and then refuses it (max_tokens 0: 400);
  0.33 cuts it to max_model_len - 1 and answers. TokenizeParams.max_output_tokens is None for a request
  without a limit where 0.32 made it 0, and `max_truncation_tokens` holds a token back unless it is 0
  (`renderers/params.py`; the chat and responses `build_tok_params` dropped their `or 0`).

Also new in 0.33 and not exercised here: `--reasoning-effort-map` (a server flag 0.32 does not accept), which
rewrites a request's effort before the chat template and `enable_thinking` see it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from tests.vllm_oracle.oracle_proc import CONTEXT, Oracle

pytestmark = pytest.mark.vllm
FAMILY = "qwen3"  # any family both releases serve (conftest.py): none of these touches the template
HI = [{"role": "user", "content": "Hi"}]
LONG = "word " * (CONTEXT + 9000)  # more tokens than the context, on every family's vocabulary
OLD, NEW = "vllm", "vllm_render"  # the releases' keys in TESTED_VERSIONS (conftest.py RELEASES)


@dataclass(frozen=True)
class Divergence:
    name: str
    endpoint: str
    body: dict[str, Any]
    status: dict[str, int]  # release -> vLLM's status
    refusal: str  # a part of the 400's message
    same_as: dict[str, Any] | None = None  # where answered, as many ids as this body (answered alike by both)
    length: int | None = None  # or this many


def responses(name: str, body: dict[str, Any], status: dict[str, int], refusal: str) -> Divergence:
    plain = {"input": "Hi", "max_output_tokens": 16}
    return Divergence(name, "responses", {**plain, **body}, status, refusal, same_as=plain)


NULL_REFUSED = {OLD: 400, NEW: 200}
TYPED = {OLD: 200, NEW: 400}
DIVERGENCES = [
    Divergence(
        "chat_skip_special_tokens_null",
        "chat",
        {"messages": HI, "max_tokens": 1, "skip_special_tokens": None},
        NULL_REFUSED,
        "valid boolean",
        same_as={"messages": HI, "max_tokens": 1},
    ),
    Divergence(
        "completions_skip_special_tokens_null",
        "completions",
        {"prompt": "Hi", "max_tokens": 1, "skip_special_tokens": None},
        NULL_REFUSED,
        "valid boolean",
        same_as={"prompt": "Hi", "max_tokens": 1},
    ),
    responses(
        "responses_skip_special_tokens_null", {"skip_special_tokens": None}, NULL_REFUSED, "valid boolean"
    ),
    responses(
        "responses_prompt_cache_retention_1h", {"prompt_cache_retention": "1h"}, TYPED, "'in_memory' or '24h'"
    ),
    responses(
        "responses_prompt_cache_options_mode",
        {"prompt_cache_options": {"mode": "always"}},
        TYPED,
        "'implicit' or 'explicit'",
    ),
    responses("responses_safety_identifier_number", {"safety_identifier": 5}, TYPED, "valid string"),
    Divergence(
        "chat_truncate_to_context_without_max_tokens",
        "chat",
        {"messages": [{"role": "user", "content": LONG}], "truncate_prompt_tokens": -1},
        {OLD: 400, NEW: 200},
        "max_tokens must be at least 1, got 0",
        length=CONTEXT - 1,
    ),
    Divergence(
        "responses_truncation_auto_without_max_output_tokens",
        "responses",
        {"input": LONG, "truncation": "auto"},
        {OLD: 400, NEW: 200},
        "max_tokens must be at least 1, got 0",
        length=CONTEXT - 1,
    ),
]


def prompt_length(answer: dict[str, Any]) -> int:
    return sum(len(ids) for ids in answer["prompts"])


@pytest.mark.parametrize("case", DIVERGENCES, ids=[d.name for d in DIVERGENCES])
def test_each_release_answers_as_its_source_says(
    oracles: dict[str, Oracle], release: str, case: Divergence
) -> None:
    oracle = oracles[FAMILY]
    answer = oracle.answer(case.endpoint, case.body)
    assert answer["status"] == case.status[release], answer.get("error", "")[:200]
    if answer["status"] != 200:
        assert case.refusal in answer["error"], answer["error"][:200]
    elif case.same_as is not None:
        reference = oracle.answer(case.endpoint, case.same_as)
        assert reference["status"] == 200, reference.get("error", "")[:200]
        assert prompt_length(answer) == prompt_length(reference)
    else:
        assert prompt_length(answer) == case.length
