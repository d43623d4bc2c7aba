"""Hypothesis-generated JSON bodies never make the counting core raise."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.core.count import CountResult, count_request
from proxy.core.endpoints import Endpoint
from tests.builders import build_tokenizer

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)
roles = st.sampled_from(["user", "assistant", "system", "tool", "developer", "x"]) | st.text(max_size=5)
parts = st.fixed_dictionaries(
    {"type": st.sampled_from(["text", "image_url", "input_audio", "weird"])}
).flatmap(
    lambda d: st.fixed_dictionaries(
        {**{k: st.just(v) for k, v in d.items()}, "text": st.text(max_size=30) | json_values}
    )
)
messages = st.lists(
    st.fixed_dictionaries(
        {"role": roles},
        optional={
            "content": st.none() | st.text(max_size=40) | st.lists(parts, max_size=3) | json_values,
            "name": json_values,
            "tool_calls": json_values,
        },
    ),
    max_size=4,
)
chat_bodies = st.fixed_dictionaries(
    {"messages": messages},
    optional={
        "tools": json_values,
        "add_generation_prompt": json_values,
        "continue_final_message": st.booleans(),
        "chat_template_kwargs": json_values,
        "documents": json_values,
        "add_special_tokens": st.booleans(),
    },
)
prompt_bodies = st.fixed_dictionaries({}, optional={"prompt": json_values, "input": json_values})
bodies = chat_bodies | prompt_bodies | json_values

TOKENIZERS = {style: build_tokenizer(style) for style in ("chatml", "llama3", "inst", "parts")}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=bodies, endpoint=st.sampled_from(list(Endpoint)), style=st.sampled_from(sorted(TOKENIZERS)))
def test_core_never_raises(body: Any, endpoint: Endpoint, style: str) -> None:
    result = count_request(TOKENIZERS[style], endpoint, body)
    assert isinstance(result, CountResult)
    if result.fallback_reason is None:
        assert result.expected_server is not None and result.expected_server >= 0
    else:
        assert result.detail is not None or result.fallback_reason == "no_template"
