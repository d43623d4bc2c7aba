"""The SGLang version the `sglang` flavor follows is one entry of proxy.core.specs.TESTED_VERSIONS: the
install script defaults to it and the docs state it (the oracle itself reports it: test_sglang_shapes.py).
Needs no SGLang install."""

from __future__ import annotations

import re

from proxy.core.specs import FLAVORS, TESTED_VERSIONS
from tests.conftest import REPO


def test_install_script_defaults_to_the_tested_sglang() -> None:
    script = (REPO / "scripts" / "install_sglang.sh").read_text()
    (default,) = re.findall(r'VERSION="\$\{SGLANG_VERSION:-([^}]+)\}"', script)
    assert default == TESTED_VERSIONS["sglang"]


def test_docs_state_what_the_sglang_flavor_follows() -> None:
    assert "sglang" in FLAVORS
    for page in ("README.md", "docs/compatibility/index.md", "docs/compatibility/sglang.md"):
        assert f"SGLang {TESTED_VERSIONS['sglang']}" in (REPO / page).read_text(), page
