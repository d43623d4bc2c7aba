"""The server parity probe against a real llama-server's /tokenize (llama.cpp's request shape).

With `--server-flavor llama.cpp` islwatch tokenizes as llama-server does (no Unicode normalization), so
every probe agrees on both models. Under the default vllm flavor the Qwen2.5 tokenizer's NFC normalizer
sets the decomposed-accent probe apart: the probe reports what docs/compatibility/llama-cpp.md documents as
`no-unicode-normalization`, before any request shows it.
"""

from __future__ import annotations

import urllib.request

import pytest

from tests.eventually import eventually
from tests.interop.interop_shapes import LLAMA3, QWEN
from tests.interop.llama_server_proc import LlamaServer
from tests.interop.proxy_proc import Proxy
from tests.server.helpers import parse_metrics, value

pytestmark = pytest.mark.llama_server


def parity(proxy: Proxy) -> float:
    def probe() -> dict:
        with urllib.request.urlopen(proxy.metrics_url, timeout=10) as r:
            return parse_metrics(r.read().decode())

    samples = eventually(
        probe,
        until=lambda m: any(k[0] == "islwatch_server_parity_ok" for k in m),
        what="the server parity verdict",
    )
    return value(samples, "islwatch_server_parity_ok", model="default")


def test_llama_cpp_flavor_tokenizes_as_the_server(llama_cpp_flavor_proxy: Proxy) -> None:
    assert parity(llama_cpp_flavor_proxy) == 1


def test_default_flavor_finds_the_normalization_difference(llama_proxy: Proxy, family: str) -> None:
    expected = {QWEN: 0, LLAMA3: 1}[family]  # Qwen2.5 normalizes NFC; llama.cpp does not
    assert parity(llama_proxy) == expected


def test_the_release_gate_checks_a_live_llama_server(llama_server: LlamaServer, family: str) -> None:
    """`islwatch parity --server` against llama-server (llama.cpp's /tokenize shape): the gate loads the
    tokenizer as transformers does, so Qwen2.5's NFC normalizer fails the NFD probe; Llama-3 passes."""
    import json
    import subprocess
    import sys

    from tests.conftest import REPO, TEST_TOKENIZERS

    out = subprocess.run(
        [sys.executable, "-m", "proxy.cli", "parity", "--tokenizer", str(TEST_TOKENIZERS / family),
         "--server", llama_server.base_url, "--json"],
        capture_output=True, text=True, cwd=REPO, timeout=300,
    )  # fmt: skip
    report = json.loads(out.stdout)
    assert report["server"]["shape"] == "llama.cpp"
    assert out.returncode == {QWEN: 1, LLAMA3: 0}[family], out.stderr
    failed = [p["name"] for p in report["probes"] if not p["equal"]]
    assert failed == (["unicode_nfd"] if family == QWEN else [])
