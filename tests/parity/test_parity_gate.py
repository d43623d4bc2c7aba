"""The gate: the normal path passes everywhere, rows get their roles, and the startup self-check."""

from __future__ import annotations

from typing import Any

import pytest
from transformers import PreTrainedTokenizerFast

from proxy.core.parity_gate import RequestMode, check, startup_self_check
from proxy.core.parity_paths import (
    BUILTIN_CONVERSATIONS,
    EXTRA_SPECIAL,
    MULTI_TURN_SERVING,
    PREFILL,
    ROWS,
    SPLIT,
    WRONG_ROLE,
)
from proxy.core.probe import first_diff
from tests.builders import build_tokenizer
from tests.parity.parity_helpers import NAMES, gated_failures, report, tokenizer

# ---- the normal path ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_normal_path_passes(name: str) -> None:
    rep = report(name)
    assert rep.ok, gated_failures(rep)
    assert rep.checked >= 3


@pytest.mark.parametrize("name", NAMES)
def test_self_check_passes_in_one_line(name: str) -> None:
    check = startup_self_check(tokenizer(name))
    assert check.ok, check.summary
    assert "\n" not in check.summary


@pytest.mark.parametrize("name", ["llama-3-8b-instruct", "qwen2.5-instruct", "built:chatml", "builtin"])
def test_continue_final_message_mode_passes(name: str) -> None:
    rep = check(tokenizer(name), mode=RequestMode(add_generation_prompt=False, continue_final_message=True))
    assert rep.ok, gated_failures(rep)
    for conv in rep.conversations:
        assert conv.skipped or conv.messages[-1] == PREFILL


def test_templates_that_reject_a_system_role_skip_that_conversation() -> None:
    rep = report("built:inst")
    skipped = [c for c in rep.conversations if c.skipped]
    assert [c.messages[0]["role"] for c in skipped] == ["system"]
    assert "template rejects it (TemplateError" in str(skipped[0].skipped)


# ---- rows ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("serving_path", [SPLIT, EXTRA_SPECIAL])
def test_the_serving_path_and_its_history_gate_negative_controls_control(serving_path: str) -> None:
    conv = report("built:llama3", serving_path).conversations[0]
    roles = {r.name: r.role for r in conv.rows}
    assert [r.name for r in conv.rows] == [name for name, _ in ROWS]
    assert {n for n, role in roles.items() if role == "gate"} == {serving_path, MULTI_TURN_SERVING}
    controls = {EXTRA_SPECIAL, WRONG_ROLE} - {serving_path}
    assert {n for n, role in roles.items() if role == "control"} == controls
    assert all(r.gated == (r.role == "gate") for r in conv.rows)


def test_request_mode_rejects_contradictory_flags() -> None:
    with pytest.raises(ValueError, match="mutually exclusive"):
        RequestMode(add_generation_prompt=True, continue_final_message=True)


def test_request_mode_rejects_an_unknown_serving_path() -> None:
    with pytest.raises(ValueError, match="serving path must be one of"):
        RequestMode(serving_path="direct")


def test_first_diff() -> None:
    assert first_diff([1, 2, 3], [1, 2, 3]) is None
    assert first_diff([1, 2, 3], [1, 9, 3]) == 1
    assert first_diff([1, 2], [1, 2, 3]) == 2
    assert first_diff([], [5]) == 0


# ---- the startup self-check ---------------------------------------------------------------------------


def test_self_check_summary_has_no_prompt_text() -> None:
    summary = startup_self_check(tokenizer("built:llama3")).summary
    texts = [m["content"] for conv in BUILTIN_CONVERSATIONS for m in conv]
    assert not any(word in summary for text in texts for word in text.split() if len(word) > 4)
    assert summary.startswith("parity ok") and "duplicates BOS" in summary


class ReaddingTokenizer(PreTrainedTokenizerFast):
    """A tokenizer class whose tokenize=True path re-adds special tokens (as some adapters' wrappers do)."""

    def apply_chat_template(self, conversation: Any, tokenize: bool = True, **kw: Any) -> Any:  # type: ignore[override]
        text = super().apply_chat_template(conversation, tokenize=False, **kw)
        return self(text, add_special_tokens=True) if tokenize else text


def test_self_check_fails_when_direct_and_split_disagree() -> None:
    base = build_tokenizer("llama3")
    tok = ReaddingTokenizer(
        tokenizer_object=base.backend_tokenizer, bos_token="<|bos|>", eos_token="<|eot_id|>"
    )
    tok.chat_template = base.chat_template
    check = startup_self_check(tok)
    assert not check.ok
    assert "split != direct at position 1" in check.summary


def test_self_check_never_raises_on_something_that_is_not_a_tokenizer() -> None:
    assert startup_self_check(object()).ok is False


def test_self_check_without_a_chat_template_fails() -> None:
    tok = build_tokenizer("chatml")
    tok.chat_template = None
    check = startup_self_check(tok)
    assert not check.ok and "no chat template" in check.summary


def test_self_check_fails_when_the_template_rejects_every_conversation() -> None:
    rejecting = build_tokenizer("chatml")
    rejecting.chat_template = "{{ raise_exception('no') }}"
    check = startup_self_check(rejecting)
    assert not check.ok and "rejected all" in check.summary
