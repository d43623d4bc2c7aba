"""Drift causes: constructed results for the decision order, real tokenizers for the signatures.

The "server" counts in the real-tokenizer tests are computed the way each faulty server computes them
(re-encoding with special tokens, no template, a hidden system turn, no generation prompt), by the real
tokenizer, not by adding constants to our own count.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import pytest

from proxy.core import causes
from proxy.core import diagnose as d
from proxy.core.count import CountResult, count_request
from tests.builders import build_tokenizer
from tests.conftest import load_shared

PROFILE = d.DriftProfile(
    has_template=True,
    plain_special_tokens=1,
    plain_adds_bos=True,
    template_emits_bos=True,
    generation_prompt_tokens=4,
    bos_text="<s>",
    bos_id=1,
)


def chat_result(bare: int = 10, templated: int = 20, **kw: Any) -> CountResult:
    fields: dict[str, Any] = {"messages": 1, **kw}
    return CountResult(
        endpoint="chat",
        bare=bare,
        templated=templated,
        expected_server=templated,
        method="chat_template",
        **fields,
    )


# ---- decision order on constructed results -------------------------------------------------------------


@pytest.mark.parametrize(
    ("server", "cause"),
    [
        (20, d.EXACT),
        (21, d.DUPLICATE_BOS),  # + plain special tokens, template emits BOS
        (10, d.TEMPLATE_NOT_APPLIED),  # == bare
        (11, d.TEMPLATE_NOT_APPLIED),  # == bare + plain special tokens
        (16, d.GENERATION_PROMPT_MISMATCH),  # − generation prompt
        (24, d.GENERATION_PROMPT_MISMATCH),  # + generation prompt
        (23, d.HIDDEN_SYSTEM_PROMPT),  # positive, >= HIDDEN_SYSTEM_MIN_TOKENS, not explained otherwise
        (120, d.HIDDEN_SYSTEM_PROMPT),
        (22, d.UNKNOWN),  # +2: too small for a system turn
        (19, d.UNKNOWN),  # −1
        (12, d.UNKNOWN),  # bare + 2: not a template-less encode of one message
    ],
)
def test_signatures_on_constructed_results(server: int, cause: str) -> None:
    assert d.classify(chat_result(), server, PROFILE) == cause


def test_duplicate_bos_needs_a_template_that_emits_bos() -> None:
    # TinyLlama's template writes no BOS: an extra special-token pass adds one BOS, it does not duplicate one.
    profile = d.DriftProfile(True, 1, True, False, 7, "<s>", 1)
    assert d.classify(chat_result(), 21, profile) == d.UNKNOWN


def test_media_and_tools_explain_any_difference_but_not_an_exact_count() -> None:
    media = chat_result(media_parts={"image": 1})
    tools = chat_result(tools=True)
    assert d.classify(media, 21, PROFILE) == d.MEDIA  # would otherwise look like duplicate BOS
    assert d.classify(media, 600, PROFILE) == d.MEDIA
    assert d.classify(tools, 10, PROFILE) == d.TOOLS_UNMODELED  # would otherwise look like no template
    assert d.classify(tools, 20, PROFILE) == d.EXACT
    assert d.classify(chat_result(media_parts={"image": 1}, tools=True), 30, PROFILE) == d.MEDIA


def test_template_not_applied_window_grows_with_messages() -> None:
    three = chat_result(bare=30, templated=60, messages=3)
    assert d.classify(three, 26, PROFILE) == d.TEMPLATE_NOT_APPLIED  # joins merged into neighbours
    assert (
        d.classify(three, 35, PROFILE) == d.TEMPLATE_NOT_APPLIED
    )  # bare + BOS + two separators, re-segmented
    assert d.classify(three, 25, PROFILE) == d.UNKNOWN
    assert d.classify(three, 36, PROFILE) == d.UNKNOWN


def test_bare_fallback_is_classified_against_the_bare_count() -> None:
    fallback = CountResult(
        endpoint="chat", bare=10, templated=None, expected_server=10, method="bare_fallback",
        fallback_reason="no_template", messages=1,
    )  # fmt: skip
    assert d.classify(fallback, 10, PROFILE) == d.EXACT
    assert d.classify(fallback, 11, PROFILE) == d.TEMPLATE_NOT_APPLIED
    assert d.classify(fallback, 30, PROFILE) == d.UNKNOWN  # no template signature to compare with


def test_completions_drift_has_no_template_signature() -> None:
    comp = CountResult(
        endpoint="completions", bare=9, templated=None, expected_server=10, method="plain_encode",
        prompts=(10,), bos_prefixed_prompt=True,
    )  # fmt: skip
    assert d.classify(comp, 10, PROFILE) == d.EXACT  # the BOS risk is its own metric, the count is exact
    assert d.classify(comp, 9, PROFILE) == d.UNKNOWN
    assert d.classify(comp, 30, PROFILE) == d.UNKNOWN


@pytest.mark.parametrize("server", [None, "20", 20.0, True, -5])
def test_classify_odd_server_counts_are_unknown(server: Any) -> None:
    assert d.classify(chat_result(), server, PROFILE) in causes.CAUSES
    invalid = CountResult(endpoint="chat", bare=None, templated=None, expected_server=None, method="none")
    assert d.classify(invalid, 20, PROFILE) == d.UNKNOWN
    assert d.classify(chat_result(), 20, None) == d.EXACT  # type: ignore[arg-type]


def test_classify_raises_on_islwatch_bugs_instead_of_calling_them_unknown() -> None:
    """A malformed result or profile is a bug: it raises, for the analysis boundary to count
    (islwatch_analysis_errors_total{stage="classify"}), instead of turning into drift data."""
    with pytest.raises(AttributeError):
        d.classify(None, 20, PROFILE)  # type: ignore[arg-type]
    with pytest.raises(AttributeError):
        d.classify(chat_result(), 21, None)  # type: ignore[arg-type]


# ---- real tokenizers ------------------------------------------------------------------------------------

SHARED = ["mistral-7b-instruct-v0.1", "llama-3-8b-instruct", "qwen2.5-instruct"]
BUILT = ["chatml", "llama3", "inst", "parts"]


@cache
def _built(style: str) -> Any:
    return build_tokenizer(style)


def tokenizer(name: str) -> Any:
    if name.startswith("built:"):
        return _built(name.removeprefix("built:"))
    return load_shared(name).tokenizer


ALL = SHARED + [f"built:{s}" for s in BUILT]
BOS_TEMPLATES = ["mistral-7b-instruct-v0.1", "llama-3-8b-instruct", "built:llama3", "built:inst"]
GEN_PROMPT = ["llama-3-8b-instruct", "qwen2.5-instruct", "built:chatml", "built:llama3", "built:parts"]
BODY = {"model": "m", "messages": [{"role": "user", "content": "What is the capital of France?"}]}
THREE = {
    "model": "m",
    "messages": [
        {"role": "user", "content": "Hello! What is 2+2?"},
        {"role": "assistant", "content": "2+2 equals 4."},
        {"role": "user", "content": "Thanks. Now say it in French."},
    ],
}


def render(tok: Any, messages: list[dict[str, Any]], gen: bool = True) -> str:
    return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)


def n(tok: Any, text: str, special: bool) -> int:
    return len(tok(text, add_special_tokens=special)["input_ids"])


def test_profiles_of_real_tokenizers() -> None:
    llama = d.build_profile(tokenizer("llama-3-8b-instruct"))
    assert (llama.plain_special_tokens, llama.template_emits_bos, llama.generation_prompt_tokens) == (
        1,
        True,
        4,
    )
    assert llama.bos_id == 128000 and llama.bos_text == "<|begin_of_text|>"
    qwen = d.build_profile(tokenizer("qwen2.5-instruct"))
    assert (qwen.plain_special_tokens, qwen.template_emits_bos, qwen.generation_prompt_tokens) == (
        0,
        False,
        3,
    )
    mistral = d.build_profile(tokenizer("mistral-7b-instruct-v0.1"))
    assert (mistral.plain_special_tokens, mistral.template_emits_bos, mistral.generation_prompt_tokens) == (
        1,
        True,
        0,
    )


def test_build_profile_never_raises_on_a_tokenizer_without_template() -> None:
    tok = build_tokenizer("chatml")
    tok.chat_template = None
    profile = d.build_profile(tok)
    assert not profile.has_template and profile.generation_prompt_tokens == 0
    assert d.build_profile(object()).plain_special_tokens == 0


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("body", [BODY, THREE], ids=["1msg", "3msg"])
def test_faithful_server_is_exact(name: str, body: dict[str, Any]) -> None:
    tok = tokenizer(name)
    result = count_request(tok, "chat", body)
    server = n(tok, render(tok, body["messages"]), special=False)  # vLLM's chat path
    assert d.classify(result, server, d.build_profile(tok)) == d.EXACT


@pytest.mark.parametrize("name", ALL)
def test_reencoding_with_special_tokens(name: str) -> None:
    tok = tokenizer(name)
    profile = d.build_profile(tok)
    result = count_request(tok, "chat", THREE)
    server = n(tok, render(tok, THREE["messages"]), special=True)
    expected = d.DUPLICATE_BOS if name in BOS_TEMPLATES else d.EXACT
    assert d.classify(result, server, profile) == expected


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("body", [BODY, THREE], ids=["1msg", "3msg"])
def test_server_without_template(name: str, body: dict[str, Any]) -> None:
    tok = tokenizer(name)
    result = count_request(tok, "chat", body)
    server = n(tok, "\n".join(m["content"] for m in body["messages"]), special=True)
    assert d.classify(result, server, d.build_profile(tok)) == d.TEMPLATE_NOT_APPLIED


@pytest.mark.parametrize("name", GEN_PROMPT)
def test_server_without_generation_prompt(name: str) -> None:
    tok = tokenizer(name)
    result = count_request(tok, "chat", THREE)
    server = n(tok, render(tok, THREE["messages"], gen=False), special=False)
    assert d.classify(result, server, d.build_profile(tok)) == d.GENERATION_PROMPT_MISMATCH


@pytest.mark.parametrize("name", ["llama-3-8b-instruct", "built:llama3"])
def test_hidden_system_turn(name: str) -> None:
    tok = tokenizer(name)
    result = count_request(tok, "chat", BODY)
    hidden = [{"role": "system", "content": "You are a careful assistant. Answer in one sentence."}]
    server = n(tok, render(tok, hidden + BODY["messages"]), special=False)
    assert server - result.templated >= d.HIDDEN_SYSTEM_MIN_TOKENS
    assert d.classify(result, server, d.build_profile(tok)) == d.HIDDEN_SYSTEM_PROMPT


def test_media_request_on_a_parts_template() -> None:
    tok = tokenizer("built:parts")
    body = {
        "model": "m",
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is this?"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                ],
            }
        ],
    }
    result = count_request(tok, "chat", body)
    assert result.media_parts == {"image": 1}
    # The server's processor expands an image into model-specific placeholder tokens.
    assert d.classify(result, result.templated + 576, d.build_profile(tok)) == d.MEDIA


def test_tools_request_on_a_template_without_tools() -> None:
    tok = tokenizer("built:llama3")
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    result = count_request(tok, "chat", {**BODY, "tools": tools})
    assert result.tools
    # A server that writes the tool schema into the prompt itself (llama.cpp, TGI grammar prompts).
    schema = '{"name": "get_weather", "parameters": {"type": "object"}}'
    server = n(tok, render(tok, [{"role": "system", "content": schema}, *BODY["messages"]]), special=False)
    assert d.classify(result, server, d.build_profile(tok)) == d.TOOLS_UNMODELED


@pytest.mark.parametrize("cause", [d.UNKNOWN, d.HIDDEN_SYSTEM_PROMPT, d.DUPLICATE_BOS])
def test_a_failed_server_probe_explains_drift(cause: str) -> None:
    assert causes.with_server_parity(cause, False) == causes.SERVER_TOKENIZER_DIFFERS
    assert causes.with_server_parity(cause, True) == cause  # parity holds: the arithmetic stands
    assert causes.with_server_parity(cause, None) == cause  # unknown: no claim


def test_exact_stays_exact_whatever_the_probe_says() -> None:
    assert causes.with_server_parity(d.EXACT, False) == d.EXACT
