"""Markers and the landing-rule table of issue 5, one test per row, checked on built wire requests."""

from __future__ import annotations

import hashlib
import logging
import re
from functools import cache
from typing import Any

import pytest

from loadgen.config import LoadgenConfig
from loadgen.workload.conversations import Workload
from loadgen.workload.markers import CacheBust, Landing, apply_marker, landing, marker_for
from proxy.core.tokens import encode_len
from tests.builders import build_tokenizer

MARKER_RE = re.compile(r"\[rid:[0-9a-f]{12}\]")
SYSTEM_N = 40


@cache
def chatml() -> Any:
    return build_tokenizer("chatml")


def first_request(cache_bust: str, system: int, parts: bool = False) -> tuple[Workload, dict[str, Any]]:
    cfg = LoadgenConfig(
        url="http://127.0.0.1:1",
        isl=200,
        shared_system_prompt_length=system,
        cache_bust=cache_bust,
        content_parts=parts,
        concurrency=1,
        request_count=1,
        run_id="run-1",
    )
    w = Workload(chatml(), cfg)
    _, req = w.start("c7")
    assert req.error is None and req.client_isl == req.target_isl == 200
    return w, req.body


def markers_in(message: dict[str, Any]) -> list[str]:
    content = message["content"]
    text = content if isinstance(content, str) else "".join(p["text"] for p in content)
    return MARKER_RE.findall(text)


def test_marker_is_sha256_of_run_and_conversation() -> None:
    digest = hashlib.sha256(b"run-1/c7").hexdigest()[:12]
    assert marker_for("run-1", "c7") == f"[rid:{digest}]"


@pytest.mark.parametrize(("run", "conversation"), [("run-1", "c8"), ("run-2", "c7")])
def test_marker_differs_per_conversation_and_per_run(run: str, conversation: str) -> None:
    assert marker_for(run, conversation) != marker_for("run-1", "c7")


def test_row_none_lands_nowhere() -> None:
    assert landing(CacheBust.NONE, True) is Landing.NOWHERE
    _, body = first_request("none", SYSTEM_N)
    assert all(not markers_in(m) for m in body["messages"])


@pytest.mark.parametrize("target", ["first_turn_prefix", "first_turn_suffix"])
@pytest.mark.parametrize("system", [0, SYSTEM_N])
def test_row_first_turn_lands_on_first_user_turn(target: str, system: int) -> None:
    assert landing(CacheBust(target), bool(system)) is Landing.FIRST_USER
    _, body = first_request(target, system)
    user = body["messages"][-1]
    assert user["role"] == "user" and markers_in(user) == [marker_for("run-1", "c7")]
    text = user["content"]
    assert (
        text.startswith(marker_for("run-1", "c7") + "\n\n")
        if target.endswith("prefix")
        else text.endswith("\n\n" + marker_for("run-1", "c7"))
    )
    assert all(not markers_in(m) for m in body["messages"][:-1])


@pytest.mark.parametrize("target", ["system_prefix", "system_suffix"])
def test_row_system_with_shared_prompt_lands_on_system(target: str) -> None:
    assert landing(CacheBust(target), True) is Landing.SYSTEM
    w, body = first_request(target, SYSTEM_N)
    system, user = body["messages"]
    assert system["role"] == "system" and markers_in(system) == [marker_for("run-1", "c7")]
    assert not markers_in(user)
    # The wire system message is N tokens, marker included; the configured length is untouched.
    assert encode_len(chatml(), system["content"], add_special_tokens=False) == SYSTEM_N
    assert w.cfg.shared_system_prompt_length == SYSTEM_N
    assert encode_len(chatml(), w.system_text or "", add_special_tokens=False) == SYSTEM_N


@pytest.mark.parametrize("target", ["system_prefix", "system_suffix"])
def test_row_system_without_shared_prompt_falls_back_to_first_user(target: str) -> None:
    assert landing(CacheBust(target), False) is Landing.FIRST_USER
    _, body = first_request(target, 0)
    (user,) = body["messages"]
    assert markers_in(user) == [marker_for("run-1", "c7")]


@pytest.mark.parametrize("target", ["first_turn_prefix", "first_turn_suffix"])
def test_list_of_parts_gets_a_new_text_part(target: str) -> None:
    _, body = first_request(target, 0, parts=True)
    parts = body["messages"][-1]["content"]
    marker_part = {"type": "text", "text": marker_for("run-1", "c7")}
    assert len(parts) == 2
    assert parts[0 if target.endswith("prefix") else -1] == marker_part


@pytest.mark.parametrize(
    ("content", "prefix", "expected"),
    [
        pytest.param("x", True, ("[rid:0]\n\nx", True), id="string-prefix"),
        pytest.param("x", False, ("x\n\n[rid:0]", True), id="string-suffix"),
        pytest.param(
            [{"type": "text", "text": "x"}],
            False,
            ([{"type": "text", "text": "x"}, {"type": "text", "text": "[rid:0]"}], True),
            id="parts-suffix",
        ),
        pytest.param({"odd": 1}, True, ({"odd": 1}, False), id="unknown-shape"),
    ],
)
def test_apply_marker_shapes(content: Any, prefix: bool, expected: tuple[Any, bool]) -> None:
    assert apply_marker(content, "[rid:0]", prefix) == expected


@pytest.mark.parametrize("prefix", [True, False])
def test_apply_marker_does_not_mutate_the_parts(prefix: bool) -> None:
    parts = [{"type": "text", "text": "x"}]
    apply_marker(parts, "[rid:0]", prefix)
    assert parts == [{"type": "text", "text": "x"}]


def test_unknown_shape_warns_once_and_adds_no_marker(caplog: pytest.LogCaptureFixture) -> None:
    w, _ = first_request("first_turn_prefix", 0)
    with caplog.at_level(logging.WARNING, logger="islwatch.loadgen"):
        assert w.mark({"odd": 1}, "[rid:0]") == {"odd": 1}
        assert w.mark(42, "[rid:0]") == 42
    assert len([r for r in caplog.records if "unknown content shape" in r.message]) == 1
