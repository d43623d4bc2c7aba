"""`islwatch count` on a request the server would refuse: the chat template raises (vLLM answers 400 and
counts nothing), so there is no `expected_server` to predict; the exit code stays 0."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.builders import save_tokenizer
from tests.forked_cli import COUNT_IMPORTS, Forks
from tests.lanes import sweep

# The [INST] template (tests/builders.py) raises on a system role and on roles that do not alternate.
SYSTEM = {
    "model": "m",
    "messages": [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "What is the capital of France?"},
    ],
}
USER = {"model": "m", "messages": [{"role": "user", "content": "What is the capital of France?"}]}


FORKS = Forks(COUNT_IMPORTS)
forks = FORKS.fixture()


def count(tokenizer: str, body: object, *args: str) -> subprocess.CompletedProcess[bytes]:
    """`islwatch count` in a child forked from an interpreter that has imported it (tests/forked_cli.py);
    tests/cli/test_count_cli.py runs the command itself."""
    return FORKS.cli.run(["count", "--tokenizer", tokenizer, *args], stdin=json.dumps(body).encode())


@pytest.fixture(scope="module")
def inst(tmp_path_factory: pytest.TempPathFactory) -> str:
    return save_tokenizer("inst", str(tmp_path_factory.mktemp("tok") / "inst"))


def test_template_that_raises_means_the_server_would_refuse(inst: str) -> None:
    proc = count(inst, SYSTEM)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["fallback_reason"] == "template_error" and out["detail"] == "TemplateError"
    assert out["server_would_refuse"] is True
    assert out["expected_server"] is None  # not the bare count: the server counts nothing
    assert out["templated"] is None
    assert isinstance(out["bare"], int) and out["bare"] > 0  # kept, for what it is worth
    assert "the server would refuse this request" in proc.stderr.decode()


def test_a_request_the_template_renders_is_not_refused(inst: str) -> None:
    proc = count(inst, USER)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["fallback_reason"] is None and out["server_would_refuse"] is False
    assert out["expected_server"] == out["templated"] > out["bare"]
    assert b"refuse" not in proc.stderr


@pytest.mark.slow  # a process each
def test_no_template_is_counted_bare_not_refused(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Without a chat template islwatch counts bare and the server may still serve it: not a refusal."""
    from tests.builders import build_tokenizer

    tok = build_tokenizer("chatml")
    tok.chat_template = None
    folder = str(tmp_path_factory.mktemp("plain") / "plain")
    tok.save_pretrained(folder)
    out = json.loads(count(folder, USER).stdout)
    assert out["fallback_reason"] == "no_template" and out["server_would_refuse"] is False
    assert out["expected_server"] == out["bare"]


@pytest.mark.slow
def test_completions_are_never_refused(inst: str) -> None:
    out = json.loads(count(inst, {"prompt": "Hello there"}, "--endpoint", "completions").stdout)
    assert out["server_would_refuse"] is False and out["expected_server"] is not None


@pytest.mark.parametrize(
    ("extra", "why"),
    sweep(
        [
            ({"reasoning_effort": "extreme"}, "reasoning_effort"),
            ({"chat_template": "{{ messages }}"}, "chat template"),
            ({"chat_template_kwargs": {"tokenize": True}}, "chat_template_kwargs"),
        ],
        unpack=True,
    ),
)
def test_a_body_vllm_refuses_is_reported_as_refused(inst: str, extra: dict[str, object], why: str) -> None:
    """vLLM's request path answers 400 before any template runs (the request model's reasoning_effort
    Literal, an untrusted request template, kwargs only vLLM may set): refused, counted as far as it goes."""
    proc = count(inst, {**USER, **extra})
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["server_would_refuse"] is True and out["expected_server"] is None
    assert out["fallback_reason"] == "server_would_refuse"
    assert b"vllm answers 400" in proc.stderr and why.encode() in proc.stderr
    accepted = json.loads(count(inst, {**USER, "reasoning_effort": "high"}).stdout)
    assert accepted["server_would_refuse"] is False and accepted["expected_server"] is not None
