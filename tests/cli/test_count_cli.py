"""`islwatch count` as a user runs it: a child process, JSON on stdout, one clear line and exit 2 on errors.
One test runs `python -m proxy.cli` itself; the others fork from an interpreter that has imported it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from proxy.core.tokenizer import load_tokenizer
from tests.builders import save_tokenizer
from tests.conftest import FAMILIES, shared_dir
from tests.forked_cli import COUNT_IMPORTS, Forks
from tests.lanes import sweep

BODY = {"model": "m", "messages": [{"role": "user", "content": "What is the capital of France?"}]}


FORKS = Forks(COUNT_IMPORTS)
forks = FORKS.fixture()


def run(*args: str, stdin: bytes | None = None, fresh: bool = False) -> subprocess.CompletedProcess[bytes]:
    """`islwatch count args...` in a child forked from an interpreter that has imported it
    (tests/forked_cli.py), or with `fresh` a new `python -m proxy.cli` process."""
    if not fresh:
        return FORKS.cli.run(["count", *args], stdin=stdin or b"")
    return subprocess.run(
        [sys.executable, "-m", "proxy.cli", "count", *args],
        input=stdin,
        capture_output=True,
        timeout=120,
        check=False,
    )


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> str:
    return save_tokenizer("llama3", str(tmp_path_factory.mktemp("tok")))


def test_count_stdin_prints_required_keys(built: str) -> None:
    proc = run("--tokenizer", built, stdin=json.dumps(BODY).encode(), fresh=True)  # the command itself
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    for key in (
        "bare",
        "templated",
        "expected_server",
        "method",
        "fallback_reason",
        "media_parts",
        "tools",
        "messages",
        "template_sha256",
    ):
        assert key in out
    tok = load_tokenizer(built).tokenizer
    assert out["templated"] == len(
        tok.apply_chat_template(BODY["messages"], add_generation_prompt=True)["input_ids"]
    )
    assert out["template_sha256"] == load_tokenizer(built).identity.template_sha256


@pytest.mark.slow  # a process each; test_count_stdin_prints_required_keys stays in the fast lane
def test_count_file_and_endpoint(built: str, tmp_path: Path) -> None:
    f = tmp_path / "body.json"
    f.write_text(json.dumps({"prompt": ["a b", "c"]}))
    proc = run("--tokenizer", built, "--endpoint", "completions", str(f))
    assert proc.returncode == 0, proc.stderr
    assert len(json.loads(proc.stdout)["prompts"]) == 2


@pytest.mark.slow
def test_chat_template_override_changes_hash_and_count(built: str, tmp_path: Path) -> None:
    f = tmp_path / "t.jinja"
    f.write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    base = json.loads(run("--tokenizer", built, stdin=json.dumps(BODY).encode()).stdout)
    over = json.loads(
        run("--tokenizer", built, "--chat-template", str(f), stdin=json.dumps(BODY).encode()).stdout
    )
    assert over["template_sha256"] != base["template_sha256"]
    assert over["templated"] == over["bare"] < base["templated"]


@pytest.mark.parametrize(
    "stdin,needle",
    sweep(
        [
            (b"{not json", "invalid JSON"),
            (b'{"prompt": "x"}', "not a chat request"),
            (b"[1]", "not a chat request"),
        ],
        unpack=True,
    ),
)
def test_bad_input_exit_2_one_line(built: str, stdin: bytes, needle: str) -> None:
    proc = run("--tokenizer", built, stdin=stdin)
    assert proc.returncode == 2
    assert needle in proc.stderr.decode()
    assert proc.stdout == b""


@pytest.mark.slow
def test_unloadable_tokenizer_exit_2(tmp_path: Path) -> None:
    proc = run("--tokenizer", str(tmp_path / "missing"), stdin=json.dumps(BODY).encode())
    assert proc.returncode == 2
    assert "cannot load tokenizer" in proc.stderr.decode()


@pytest.mark.parametrize("family", sweep(FAMILIES))
def test_count_on_every_shared_tokenizer(family: str) -> None:
    proc = run("--tokenizer", str(shared_dir(family)), stdin=json.dumps(BODY).encode())
    assert proc.returncode == 0, (family, proc.stderr[-500:])
    out = json.loads(proc.stdout)
    assert out["method"] == "chat_template" and out["templated"] > out["bare"], family


@pytest.mark.slow
def test_builtin_tokenizer_offline() -> None:
    proc = run("--tokenizer", "builtin:mistral-v0.1", stdin=json.dumps(BODY).encode())
    assert proc.returncode == 0, proc.stderr
    from mistral_common.protocol.instruct.messages import UserMessage
    from mistral_common.protocol.instruct.request import ChatCompletionRequest
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

    request = ChatCompletionRequest(messages=[UserMessage(content=BODY["messages"][0]["content"])])
    expected = MistralTokenizer.v1().encode_chat_completion(request).tokens
    assert json.loads(proc.stdout)["templated"] == len(expected)
