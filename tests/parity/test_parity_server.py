"""`islwatch parity --server URL`: the server parity probes against a real aiohttp server on a socket.

The test server implements both `/tokenize` request shapes the way the real servers answer them: vLLM's
(`prompt`, `add_special_tokens`, `model`: a 400 for a body it cannot parse, a 404 for a model it does not
serve) and llama.cpp's (`content`, `add_special`; a body without `content` gets `200 {"tokens": []}`, as
llama-server's handler answers). Its ids come from the same tokenizer folder islwatch loads, exactly or
perturbed; a third server has no `/tokenize` at all.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from proxy.core.probe_set import PROBE_TEXTS, probes
from proxy.core.tokenizer import load_tokenizer
from tests.builders import save_tokenizer
from tests.parity.parity_helpers import run_cli
from tests.server.helpers import Background, serve_app

SENTENCE = dict(PROBE_TEXTS)["sentence"]
SERVED_MODEL = "served-llama"

# How the server's tokenizer departs from islwatch's: text, add_special -> ids.
Encode = Callable[[Any, str, bool], list[int]]


def exact(tok: Any, text: str, add_special: bool) -> list[int]:
    return list(tok(text, add_special_tokens=add_special)["input_ids"])


def sentence_by_characters(tok: Any, text: str, add_special: bool) -> list[int]:
    """A server whose tokenizer does not merge across characters in one probe text (the 8-vs-6 ids case)."""
    if text != SENTENCE:
        return exact(tok, text, add_special)
    return [i for ch in text for i in tok(ch, add_special_tokens=False)["input_ids"]]


def always_bos(tok: Any, text: str, add_special: bool) -> list[int]:
    """A server that ignores the request's add_special flag and always adds BOS."""
    return exact(tok, text, True)


@dataclass
class TokenizeServer:
    """What one test server does and what it received."""

    tok: Any
    shape: str  # "vllm" or "llama.cpp"
    encode: Encode = exact
    bodies: list[dict[str, Any]] = field(default_factory=list)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/tokenize", self.tokenize)
        return app

    async def tokenize(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.bodies.append(body)
        if self.shape == "vllm":
            # vllm/entrypoints/serve/tokenize: a completion request needs `prompt`; an unknown model is 404.
            if not isinstance(body.get("prompt"), str):
                return web.json_response({"error": {"message": "validation error"}}, status=400)
            if "model" in body and body["model"] != SERVED_MODEL:
                return web.json_response({"error": {"message": "model does not exist"}}, status=404)
            ids = self.encode(self.tok, body["prompt"], body.get("add_special_tokens", True))
            return web.json_response({"count": len(ids), "max_model_len": 4096, "tokens": ids})
        # llama-server's tokenize handler: no `content`, no tokens (and still 200).
        if "content" not in body:
            return web.json_response({"tokens": []})
        return web.json_response(
            {"tokens": self.encode(self.tok, body["content"], body.get("add_special", False))}
        )


@pytest.fixture(scope="module")
def background() -> Iterator[Background]:
    bg = Background()
    yield bg
    bg.close()


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The test-built llama3 tokenizer: its encode adds BOS, so a server ignoring add_special shows."""
    return save_tokenizer("llama3", str(tmp_path_factory.mktemp("tok") / "llama3"))


@pytest.fixture(scope="module")
def server_tok(folder: str) -> Any:
    return load_tokenizer(folder).tokenizer


def start(background: Background, server: TokenizeServer | web.Application) -> str:
    app = server.app() if isinstance(server, TokenizeServer) else server
    return background.enter(serve_app(app))


def probe_texts(tok: Any) -> list[str]:
    return [p.text for p in probes(tok)]


def first_difference(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def free_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --------------------------------------------------------------------------- pass: exit 0


@pytest.mark.parametrize("shape", ["vllm", "llama.cpp"])
def test_equal_server_passes_with_a_table(
    capsys: pytest.CaptureFixture[str], background: Background, folder: str, server_tok: Any, shape: str
) -> None:
    server = TokenizeServer(server_tok, shape)
    url = start(background, server)
    code, out, err = run_cli(capsys, "--tokenizer", folder, "--server", url)
    assert code == 0, out + err
    texts = probe_texts(server_tok)
    assert "server parity PASS" in out and f"server parity ok: {len(texts)} probes equal" in out
    assert f"/tokenize shape {shape}" in out
    for name in ("sentence", "unicode_nfd", "emoji", "special_0", "rendered_chat"):
        assert name in out
    assert " NO " not in out and "differs" not in out
    # Only the probe texts were sent, each without special tokens.
    if shape == "vllm":
        assert [b["prompt"] for b in server.bodies] == texts
        assert all(b["add_special_tokens"] is False and "model" not in b for b in server.bodies)
    else:
        first, *rest = server.bodies
        assert "prompt" in first and "content" not in first  # the vLLM shape, answered with no tokens
        assert [b["content"] for b in rest] == texts
        assert all(b["add_special"] is False and b["parse_special"] is True for b in rest)


def test_model_is_sent_as_vllm_model_field(
    capsys: pytest.CaptureFixture[str], background: Background, folder: str, server_tok: Any
) -> None:
    server = TokenizeServer(server_tok, "vllm")
    url = start(background, server)
    code, out, _ = run_cli(capsys, "--tokenizer", folder, "--server", url, "--model", SERVED_MODEL, "--json")
    data = json.loads(out)
    assert code == 0 and data["ok"] and data["verdict"] == "pass"
    assert data["server"] == {"url": url, "model": SERVED_MODEL, "shape": "vllm"}
    assert {b["model"] for b in server.bodies} == {SERVED_MODEL}


def test_json_report_of_a_pass(
    capsys: pytest.CaptureFixture[str], background: Background, folder: str, server_tok: Any
) -> None:
    url = start(background, TokenizeServer(server_tok, "llama.cpp"))
    code, out, _ = run_cli(capsys, "--tokenizer", folder, "--server", url, "--json")
    data = json.loads(out)
    assert code == 0 and data["exit_code"] == 0 and data["ok"] is True
    assert list(data) == [
        "ok", "exit_code", "verdict", "reason", "detail", "summary", "server", "tokenizer", "probes",
    ]  # fmt: skip
    assert data["verdict"] == "pass" and data["reason"] is None and data["server"]["shape"] == "llama.cpp"
    assert data["tokenizer"]["files"]["tokenizer.json"]
    by_name = {p["name"]: p for p in data["probes"]}
    assert [p["text"] for p in data["probes"]] == probe_texts(server_tok)
    sentence = by_name["sentence"]
    assert sentence["ours_ids"] == exact(server_tok, SENTENCE, False) == sentence["theirs_ids"]
    assert sentence["equal"] is True and sentence["first_diff"] is None
    assert sentence["ours"] == sentence["theirs"] == len(sentence["ours_ids"])


# --------------------------------------------------------------------------- fail: exit 1


@pytest.mark.parametrize("shape", ["vllm", "llama.cpp"])
def test_one_probe_differing_fails_with_its_position(
    capsys: pytest.CaptureFixture[str], background: Background, folder: str, server_tok: Any, shape: str
) -> None:
    url = start(background, TokenizeServer(server_tok, shape, sentence_by_characters))
    ours = exact(server_tok, SENTENCE, False)
    theirs = sentence_by_characters(server_tok, SENTENCE, False)
    assert ours != theirs and len(theirs) > len(ours)  # the perturbation is real
    at = first_difference(ours, theirs)

    code, out, _ = run_cli(capsys, "--tokenizer", folder, "--server", url, "--json")
    data = json.loads(out)
    assert code == 1 and data["exit_code"] == 1 and data["ok"] is False and data["verdict"] == "fail"
    bad = [p for p in data["probes"] if not p["equal"]]
    assert [p["name"] for p in bad] == ["sentence"]
    (p,) = bad
    assert p["first_diff"] == at and p["ours_ids"] == ours and p["theirs_ids"] == theirs
    assert (p["ours"], p["theirs"]) == (len(ours), len(theirs))
    assert data["summary"] == (
        f"server parity FAILED on 1 of {len(data['probes'])} probes: "
        f"sentence at {at} ({len(theirs) - len(ours):+d} tokens)"
    )

    code, out, _ = run_cli(capsys, "--tokenizer", folder, "--server", url)
    assert code == 1
    assert f"sentence differs at position {at} ({len(ours)} vs {len(theirs)} tokens)" in out
    assert "server parity FAIL" in out and "PASS" not in out
    assert f"islwatch [{max(at - 3, 0)}:" in out and "server   [" in out  # the ids around the difference


def test_server_adding_bos_fails_every_probe(
    capsys: pytest.CaptureFixture[str], background: Background, folder: str, server_tok: Any
) -> None:
    url = start(background, TokenizeServer(server_tok, "vllm", always_bos))
    code, out, _ = run_cli(capsys, "--tokenizer", folder, "--server", url, "--json")
    data = json.loads(out)
    assert code == 1 and data["verdict"] == "fail"
    at = {p["name"]: p["first_diff"] for p in data["probes"] if p["equal"] is False}
    assert set(at) == {p["name"] for p in data["probes"]}, at
    # The rendered chat already starts with the template's BOS: the second one differs.
    assert at.pop("rendered_chat") == 1 and set(at.values()) == {0}, at
    assert all(p["theirs"] == p["ours"] + 1 for p in data["probes"])
    bos = server_tok.convert_tokens_to_ids("<|bos|>")
    assert {p["theirs_ids"][0] for p in data["probes"]} == {bos}


# --------------------------------------------------------------------------- unknown: exit 2, never a pass


def test_server_without_tokenize_is_unknown(
    capsys: pytest.CaptureFixture[str], background: Background, folder: str
) -> None:
    url = start(background, web.Application())  # every path 404
    code, out, err = run_cli(capsys, "--tokenizer", folder, "--server", url, "--json")
    data = json.loads(out)
    assert code == 2 and data["exit_code"] == 2 and data["ok"] is False
    assert data["verdict"] == "unknown" and data["reason"] == "no_tokenize"
    assert data["server"]["shape"] is None
    assert data["probes"] and all(
        p["equal"] is None and p["theirs"] is None and p["theirs_ids"] is None and p["ours_ids"]
        for p in data["probes"]
    )
    assert "answered neither the vLLM nor the llama.cpp request shape" in err

    code, out, err = run_cli(capsys, "--tokenizer", folder, "--server", url)
    assert code == 2
    assert "server parity UNKNOWN (no_tokenize)" in out and "PASS" not in out and "FAIL" not in out
    assert "server parity unknown" in err


def test_vllm_refusing_the_model_is_unknown_not_a_failure(
    capsys: pytest.CaptureFixture[str], background: Background, folder: str, server_tok: Any
) -> None:
    url = start(background, TokenizeServer(server_tok, "vllm"))
    code, out, _ = run_cli(capsys, "--tokenizer", folder, "--server", url, "--model", "other", "--json")
    data = json.loads(out)
    assert code == 2 and data["verdict"] == "unknown" and data["reason"] == "no_tokenize"


def test_unreachable_server_is_unknown(capsys: pytest.CaptureFixture[str], folder: str) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    code, out, err = run_cli(capsys, "--tokenizer", folder, "--server", url, "--json")
    data = json.loads(out)
    assert code == 2 and data["verdict"] == "unknown" and data["reason"] == "unreachable"
    assert f"cannot reach {url}" in data["detail"] and f"cannot reach {url}" in err


# --------------------------------------------------------------------------- usage errors: exit 2


@pytest.mark.parametrize(
    "extra,needle",
    [
        (["--server", "localhost:8000"], "must be an http:// or https:// URL"),
        (["--server", "http://[::1"], "must be an http:// or https:// URL"),
        (
            ["--server", "http://127.0.0.1:1", "--baseline", "b.json"],
            "--baseline belong to the serialization",
        ),
        (["--server", "http://127.0.0.1:1", "--serving-path", "extra-special"], "--serving-path"),
        (["--server", "http://127.0.0.1:1", "--continue-final-message"], "--continue-final-message"),
        (["--model", "m"], "--model is only used with --server"),
    ],
)
def test_usage_errors_exit_2(
    capsys: pytest.CaptureFixture[str], folder: str, extra: list[str], needle: str
) -> None:
    code, out, err = run_cli(capsys, "--tokenizer", folder, *extra)
    assert code == 2 and out == ""
    assert needle in err


def test_unloadable_tokenizer_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, err = run_cli(
        capsys, "--tokenizer", str(tmp_path / "missing"), "--server", "http://127.0.0.1:1"
    )
    assert code == 2 and out == "" and "cannot load tokenizer" in err


def test_help_lists_server_flags() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "proxy.cli", "parity", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0 and "--server URL" in proc.stdout and "--model MODEL" in proc.stdout
