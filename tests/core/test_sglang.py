"""The sglang flavor's rules for agent traffic, without SGLang (each is checked against SGLang 0.5.23 itself in
tests/sglang_server): reasoning in history, template refusals and the flat-tools retry, gpt-oss's effort
check, the server's default template kwargs."""

from __future__ import annotations

import copy
from functools import cache
from typing import Any

from proxy.core.count import SERVER_REFUSES
from proxy.core.encoders import ReferenceEncoder
from proxy.core.fast import best_encoder
from proxy.core.flavors.sglang import GPT_OSS, count_sglang
from proxy.core.server_settings import ServerSettings
from tests.conftest import load_shared

CALL = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}


@cache
def encoder(family: str) -> Any:
    return best_encoder(load_shared(family).tokenizer)


def count(family: str, body: dict[str, Any], **kw: Any) -> Any:
    return count_sglang(encoder(family), "chat", body, **kw)


def agent_turn(**reasoning: str) -> dict[str, Any]:
    turn = {"role": "assistant", "content": None, "tool_calls": [CALL], **reasoning}
    return {
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            turn,
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        ],
        "tools": [WEATHER],
    }


def test_reasoning_content_reaches_a_template_that_reads_it() -> None:
    plain = count("qwen3", agent_turn()).expected_server
    assert count("qwen3", agent_turn(reasoning_content="I should look it up.")).expected_server > plain


def test_reasoning_is_not_a_field_of_sglang_messages() -> None:
    """vLLM's `reasoning` name: SGLang's message model has no such field, the template never sees it."""
    for family in ("qwen3", "gpt-oss"):
        plain = count(family, agent_turn()).expected_server
        assert count(family, agent_turn(reasoning="I should look it up.")).expected_server == plain


def test_gpt_oss_template_sees_no_thinking() -> None:
    """transformers 5.19.0 (SGLang's pin) does not copy `reasoning_content` to `thinking`, the field gpt-oss's
    template reads: the analysis message is not rendered (transformers 5.24 would render it)."""
    plain = count("gpt-oss", agent_turn()).expected_server
    assert count("gpt-oss", agent_turn(reasoning_content="I should look it up.")).expected_server == plain


def test_a_template_error_is_a_refusal() -> None:
    parallel = agent_turn()
    parallel["messages"][1]["tool_calls"] = [CALL, {**CALL, "id": "c2"}]
    result = count("llama-3.1", parallel)  # "This model only supports single tool-calls at once!"
    assert (result.fallback_reason, result.expected_server) == (SERVER_REFUSES, None)
    assert result.detail == "sglang answers 400: the chat template raises TemplateError"
    result = count("deepseek-r1", agent_turn())  # '```json\n' + arguments parsed to an object
    assert result.detail == "sglang answers 400: the chat template raises TypeError"


def test_tools_are_flattened_when_the_template_raises() -> None:
    """`_apply_jinja_template` renders once more with each tool as its function alone."""
    tok = copy.copy(load_shared("qwen3").tokenizer)
    tok.chat_template = "{% for t in tools %}{{ t.name + ':' }}{% endfor %}{{ messages[0].content }}"
    enc = ReferenceEncoder(tok)
    body = {"messages": [{"role": "user", "content": "Hi"}], "tools": [WEATHER]}
    result = count_sglang(enc, "chat", body)
    assert result.fallback_reason is None
    assert result.expected_server == len(tok.encode("get_weather:Hi", add_special_tokens=False))


def test_gpt_oss_refuses_effort_none_in_template_kwargs() -> None:
    body = {
        "messages": [{"role": "user", "content": "Hi"}],
        "chat_template_kwargs": {"reasoning_effort": "none"},
    }
    refused = count("gpt-oss", body, model_type=GPT_OSS)
    assert refused.detail == "sglang answers 400: Harmony does not support reasoning effort none"
    assert count("gpt-oss", body).fallback_reason is None  # the model type unknown: counted
    top_level = {"messages": body["messages"], "reasoning_effort": "none"}  # only the kwargs' is checked
    assert count("gpt-oss", top_level, model_type=GPT_OSS).fallback_reason is None


def test_server_defaults_fill_what_the_request_leaves_out() -> None:
    hi = [{"role": "user", "content": "Hi"}]
    off = ServerSettings(default_chat_template_kwargs={"enable_thinking": False})
    thinking_off = {"messages": hi, "chat_template_kwargs": {"enable_thinking": False}}
    assert (
        count("qwen3", {"messages": hi}, settings=off).expected_server
        == count("qwen3", thinking_off).expected_server
    )
    # the request's switch wins, its own or the one its reasoning effort sets
    for body in ({"messages": hi, "chat_template_kwargs": {"enable_thinking": True}},
                 {"messages": hi, "reasoning_effort": "low"}):  # fmt: skip
        assert (
            count("qwen3", body, settings=off).expected_server
            == count("qwen3", {"messages": hi}).expected_server
        )


def test_a_default_effort_wins_over_the_request() -> None:
    """The request's effort is taken out of its kwargs before the defaults fill them; the template kwargs
    (with the default's effort) are applied after the request's effort. ("xhigh" is one token more than "low"
    in gpt-oss's system message.)"""
    hi = [{"role": "user", "content": "Hi"}]
    high = ServerSettings(default_chat_template_kwargs={"reasoning_effort": "xhigh"})
    expected = count("gpt-oss", {"messages": hi, "reasoning_effort": "xhigh"}).expected_server
    assert count("gpt-oss", {"messages": hi, "reasoning_effort": "low"}).expected_server != expected
    for body in ({"messages": hi, "reasoning_effort": "low"},
                 {"messages": hi, "chat_template_kwargs": {"reasoning_effort": "low"}},
                 {"messages": hi}):  # fmt: skip
        assert count("gpt-oss", body, settings=high).expected_server == expected
