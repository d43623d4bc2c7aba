"""The server parity probe against a real llama-server's /tokenize (llama.cpp's request shape).

With `--server-flavor llama.cpp` islwatch tokenizes as llama-server does (no Unicode normalization), so
every probe agrees on both models. Under the default vllm flavor the Qwen2.5 tokenizer's NFC normalizer
sets the decomposed-accent probe apart: the probe reports what the README documents as
`no-unicode-normalization`, before any request shows it.
"""

from __future__ import annotations

import urllib.request

import pytest

from interop.interop_shapes import LLAMA3, QWEN
from interop.proxy_proc import Proxy
from tests.eventually import eventually
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
