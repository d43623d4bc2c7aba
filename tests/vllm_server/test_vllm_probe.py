"""The server parity probe against real vLLM servers' /tokenize: every served family tokenizes as islwatch
does. Where the server's tokenizer differs from islwatch's, the probe fails and the drift is named
`server_tokenizer_differs` instead of `unknown`; that difference comes from the fixture: the Llama 3.1
server behind a proxy told DeepSeek-V3's tokenizer (vllm_proc.py PROBE_SERVER, PROBE_TOKENIZER), as a stale
tokenizer in the proxy's config would be.

DeepSeek-V3 itself is not such a case. In its own folder (config.json `model_type: deepseek_v3`) vLLM 0.32's
transformers (5.19) loads its tokenizer as islwatch's (5.24) does, and the in-process oracle counts its
requests as islwatch does (tests/vllm_oracle). An earlier fixture served its files in a tiny model typed
`llama`: 5.19 then loads them as LlamaTokenizer, which encodes otherwise (8 ids for "Return the word READY.",
6 with the files' own tokenizer); that drift was the fixture's, not DeepSeek's."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import pytest

from tests.eventually import eventually
from tests.server.helpers import Background, parse_metrics, value
from tests.vllm_server.conftest import start_proxy
from tests.vllm_server.test_vllm_direct import request
from tests.vllm_server.vllm_proc import PROBE_SERVER, PROBE_TOKENIZER, VllmServer, post_raw
from tests.vllm_server.vllm_shapes import CHAT

pytestmark = pytest.mark.vllm
SINGLE_TURN = next(s for s in CHAT if s.name == "single_turn")


def metrics(admin_url: str) -> dict[Any, float]:
    with urllib.request.urlopen(admin_url + "/metrics", timeout=30) as r:
        return parse_metrics(r.read().decode())


def parity(admin_url: str, model: str) -> float:
    samples = eventually(
        lambda: metrics(admin_url),
        until=lambda m: ("islwatch_server_parity_ok", frozenset({("model", model)})) in m,
        what=f"the server parity verdict for {model}",
    )
    return value(samples, "islwatch_server_parity_ok", model=model)


def test_families_islwatch_tokenizes_alike_pass(vllm: VllmServer, proxied: tuple[str, str]) -> None:
    assert parity(proxied[1], vllm.model) == 1


def test_a_differing_server_tokenizer_is_found_and_named(
    vllm_servers: dict[str, VllmServer], mistold_proxy: tuple[str, str]
) -> None:
    server = vllm_servers[PROBE_SERVER]
    url, admin_url = mistold_proxy
    assert parity(admin_url, server.model) == 0
    before = metrics(admin_url)
    status, raw = post_raw(url, "/v1/chat/completions", request(SINGLE_TURN, server))
    assert status == 200, raw[:300]
    after = eventually(
        lambda: metrics(admin_url),
        until=lambda m: value(m, "islwatch_drift_total") > value(before, "islwatch_drift_total"),
        what="the request's drift cause",
    )
    assert value(after, "islwatch_isl_match_total", result="mismatch") == 1 + value(
        before, "islwatch_isl_match_total", result="mismatch"
    )
    differs = "islwatch_drift_total"
    assert value(after, differs, cause="server_tokenizer_differs") == 1 + value(
        before, differs, cause="server_tokenizer_differs"
    )


def test_other_server_template_kwargs_are_named(
    vllm_servers: dict[str, VllmServer], background: Background
) -> None:
    """The chat probe against a real vLLM: its /tokenize renders the probe chat with its own template and
    server-wide kwargs. A proxy told `enable_thinking: false` (as if the server ran
    `--default-chat-template-kwargs`) in front of a Qwen3 server started without it: the verdict differs
    and names the kwargs under which islwatch renders the server's ids. (Every family's own proxy above
    passes the same chat probe: test_families_islwatch_tokenizes_alike_pass.)"""
    server = vllm_servers["qwen3"]
    _, admin_url = start_proxy(background, server, default_chat_template_kwargs={"enable_thinking": False})
    assert parity(admin_url, server.model) == 0
    with urllib.request.urlopen(admin_url + "/readyz", timeout=30) as r:
        ready = json.loads(r.read())
    detail = ready["server_parity_detail"][server.model]
    assert "server parity ok" in detail  # the text probes: the same tokenizer
    assert "rendered chat differs" in detail and '{"enable_thinking": true}' in detail


@pytest.mark.parametrize(("tokenizer", "code"), [(PROBE_SERVER, 0), (PROBE_TOKENIZER, 1)])
def test_the_release_gate_checks_a_live_server(
    vllm_servers: dict[str, VllmServer], tokenizer: str, code: int
) -> None:
    """`islwatch parity --server`: exit 0 given the server's own tokenizer, 1 given another that tokenizes
    otherwise."""
    import json
    import subprocess
    import sys

    from tests.conftest import REPO, TEST_TOKENIZERS

    server = vllm_servers[PROBE_SERVER]
    out = subprocess.run(
        [sys.executable, "-m", "proxy.cli", "parity", "--tokenizer", str(TEST_TOKENIZERS / tokenizer),
         "--server", server.base_url, "--model", server.model, "--json"],
        capture_output=True, text=True, cwd=REPO, timeout=300,
    )  # fmt: skip
    assert out.returncode == code, out.stderr
    report = json.loads(out.stdout)
    assert report["server"]["shape"] == "vllm"
    assert report["ok"] is (code == 0)
