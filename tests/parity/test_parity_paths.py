"""The serialization paths: each negative control fails at the right position; legitimate repetition passes.

Expected positions are derived from the ids themselves (the BOS id, the role token's text), not from the
code under test.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import proxy.core
import proxy.parity
from proxy.core.parity_paths import (
    DIRECT,
    EXTRA_SPECIAL,
    GEN_OFF,
    MULTI_TURN_SERVING,
    SPLIT,
    WRONG_ROLE,
    path_ids,
    wrong_role_text,
)
from proxy.core.tokens import render_messages
from tests.builders import build_tokenizer
from tests.parity.parity_helpers import ADDS_BOS, NAMES, TEMPLATE_BOS, report, tokenizer

# ---- negative controls -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_extra_special_token_pass_is_caught_where_bos_is_added(name: str) -> None:
    tok = tokenizer(name)
    rep = report(name, EXTRA_SPECIAL)
    conv = rep.conversations[0]
    direct, extra = conv.row(DIRECT), conv.row(EXTRA_SPECIAL)
    assert direct is not None and extra is not None and direct.ids is not None and extra.ids is not None
    if name not in ADDS_BOS:
        assert rep.ok and extra.equal  # nothing added: the control rightly sees no difference
        return
    assert not rep.ok
    assert extra.ids[0] == tok.bos_token_id
    if name in TEMPLATE_BOS:
        assert direct.ids[0] == tok.bos_token_id and extra.ids[1] == tok.bos_token_id
        assert extra.first_diff == 1 and extra.duplicate_bos
    else:  # TinyLlama: the template writes no BOS, the pass adds the only one, at the front
        assert direct.ids[0] != tok.bos_token_id
        assert extra.first_diff == 0 and not extra.duplicate_bos
    assert extra.ids[1:] == direct.ids  # the pass adds one BOS at the front and changes nothing else


@pytest.mark.parametrize(
    "name", [n for n in NAMES if n not in ("mistral-7b-instruct-v0.1", "builtin", "built:inst")]
)
def test_wrong_role_prefix_fails_at_the_role_token(name: str) -> None:
    tok = tokenizer(name)
    rep = report(name, WRONG_ROLE)
    assert not rep.ok
    for conv in rep.conversations:
        if conv.skipped:
            continue
        direct, wrong = conv.row(DIRECT), conv.row(WRONG_ROLE)
        assert direct and wrong and direct.ids and wrong.first_diff is not None
        # The first differing token of the correct prompt starts the last "assistant" role name (one token
        # in real vocabularies; a few pieces in the small test-built BPE).
        fd = wrong.first_diff
        assert "ssistant" in tok.decode(direct.ids[fd : fd + 6]), (tok.decode(direct.ids[fd:]), fd)
        assert "ssistant" not in tok.decode(direct.ids[fd:]).split("ssistant", 1)[1]


@pytest.mark.parametrize("name", ["llama-3-8b-instruct", "qwen2.5-instruct", "built:llama3", "built:chatml"])
def test_dropped_generation_prompt_fails_where_it_would_start(name: str) -> None:
    rep = report(name, GEN_OFF)
    assert not rep.ok
    for conv in rep.conversations:
        if conv.skipped:
            continue
        direct, off = conv.row(DIRECT), conv.row(GEN_OFF)
        assert direct and off and direct.ids and off.ids
        assert direct.ids[: len(off.ids)] == off.ids  # a strict prefix: the gen prompt is missing at the end
        assert off.first_diff == len(off.ids)


def test_wrong_role_does_not_apply_to_templates_without_a_generation_prompt() -> None:
    rep = report("builtin", WRONG_ROLE)
    row = rep.conversations[0].row(WRONG_ROLE)
    assert row is not None and row.ids is None and row.note == "template adds no role header"
    assert not rep.ok  # a serving path that cannot be computed is never a pass


def test_wrong_role_text_opens_a_user_turn_where_the_assistant_turn_was() -> None:
    tok = build_tokenizer("chatml")
    messages = [{"role": "user", "content": "hi"}]
    right = render_messages(tok, messages, True, False)
    wrong = wrong_role_text(tok, messages)
    assert right.endswith("<|im_start|>assistant\n")
    assert wrong == right.removesuffix("assistant\n") + "user\n"


def test_wrong_role_does_not_apply_without_a_generation_prompt() -> None:
    tok = build_tokenizer("chatml")
    ids, note = path_ids(tok, WRONG_ROLE, [{"role": "user", "content": "hi"}], False, False, SPLIT)
    assert ids is None and note == "no generation prompt in this mode"


# ---- legitimate repetition vs duplication -------------------------------------------------------------

REPEATING_EOS = [
    "mistral-7b-instruct-v0.1",
    "llama-3-8b-instruct",
    "qwen2.5-instruct",
    "built:llama3",
    "built:inst",
]


@pytest.mark.parametrize("name", REPEATING_EOS)
def test_repeated_eos_in_the_history_passes(name: str) -> None:
    eos = tokenizer(name).eos_token_id
    multi = report(name).conversations[0].row(MULTI_TURN_SERVING)
    assert multi is not None and multi.ids is not None and multi.equal and multi.gated
    assert list(multi.ids).count(eos) >= 2  # every completed assistant turn closed with EOS
    assert report(name).ok


@pytest.mark.parametrize("name", REPEATING_EOS)
def test_duplicated_bos_in_the_history_fails(name: str) -> None:
    bad = report(name, EXTRA_SPECIAL)
    bad_multi = bad.conversations[0].row(MULTI_TURN_SERVING)
    if name == "qwen2.5-instruct":  # no BOS anywhere: the extra pass is harmless
        assert bad.ok
    else:
        assert not bad.ok and bad_multi is not None and bad_multi.duplicate_bos and bad_multi.first_diff == 1


# ---- one render/encode layer --------------------------------------------------------------------------


def _direct_tokenizer_calls(source: Path) -> list[str]:
    """`x.apply_chat_template(...)` and `tok(...)` calls in a module (docstrings may name them)."""
    found = []
    for node in ast.walk(ast.parse(source.read_text())):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == "apply_chat_template":
            found.append(f"{source.name}:{node.lineno}")
        if isinstance(func, ast.Name) and func.id == "tok":
            found.append(f"{source.name}:{node.lineno}")
    return found


def test_parity_code_renders_and_encodes_only_through_core_tokens() -> None:
    core = Path(proxy.core.__file__).parent
    sources = sorted(
        [*Path(proxy.parity.__file__).parent.glob("*.py"), core / "parity_gate.py", core / "parity_paths.py"]
    )
    assert {s.name for s in sources} >= {"parity_gate.py", "parity_paths.py", "server.py"}
    assert [call for s in sources for call in _direct_tokenizer_calls(s)] == []
