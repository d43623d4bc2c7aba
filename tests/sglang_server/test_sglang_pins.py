"""The SGLang version the `sglang` flavor follows is one entry of proxy.core.specs.TESTED_VERSIONS: the
install script defaults to it and the README states it (the oracle itself reports it: test_sglang_shapes.py).
Needs no SGLang install."""

from __future__ import annotations

import re

from proxy.core.specs import FLAVORS, TESTED_VERSIONS
from tests.conftest import REPO


def test_install_script_defaults_to_the_tested_sglang() -> None:
    script = (REPO / "scripts" / "install_sglang.sh").read_text()
    (default,) = re.findall(r'VERSION="\$\{SGLANG_VERSION:-([^}]+)\}"', script)
    assert default == TESTED_VERSIONS["sglang"]


def test_readme_states_what_the_sglang_flavor_follows() -> None:
    readme = (REPO / "README.md").read_text()
    assert f"SGLang {TESTED_VERSIONS['sglang']}" in readme
    assert "## Tested against SGLang" in readme
    assert "sglang" in FLAVORS
