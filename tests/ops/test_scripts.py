"""scripts/install_prometheus.sh and scripts/check_rules.sh: syntax, idempotence, and what they run."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.conftest import unavailable
from tests.ops.opslib import INSTALL_HINT, PROMETHEUS_HOME, REPO, find_tool

SCRIPTS = [REPO / "scripts" / "install_prometheus.sh", REPO / "scripts" / "check_rules.sh"]


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_bash_syntax(script: os.PathLike[str]) -> None:
    result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr


def test_install_is_idempotent() -> None:
    """Run again where it already installed: nothing downloaded, the binaries reported."""
    if not (PROMETHEUS_HOME / "bin" / "prometheus").is_file():
        unavailable(f"prometheus not installed in {PROMETHEUS_HOME}; {INSTALL_HINT}")
    result = subprocess.run(["bash", str(SCRIPTS[0])], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert "already installed" in result.stderr and "downloaded" not in result.stderr
    # stdout is only `export` lines, for `eval "$(bash scripts/install_prometheus.sh)"`.
    exports = dict(line.removeprefix("export ").split("=", 1) for line in result.stdout.splitlines())
    assert set(exports) == {"ISLWATCH_PROMETHEUS", "ISLWATCH_PROMTOOL"}
    for path in exports.values():
        assert subprocess.run([path, "--version"], capture_output=True, check=False).returncode == 0


def test_check_rules_passes() -> None:
    if find_tool("promtool") is None:
        unavailable(f"promtool not found; {INSTALL_HINT}")
    result = subprocess.run(["bash", str(SCRIPTS[1])], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout and "Unit Testing" in result.stdout
