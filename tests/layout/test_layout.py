"""The layout's rules, held by tests: the counting core is pure, and `--help` loads nothing heavy.

Checked in fresh interpreters, so an import anywhere down the chain counts (a static grep would miss a
transitive import).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CORE_MODULES = sorted(
    f"proxy.core.{p.stem}" for p in (REPO / "proxy" / "core").glob("*.py") if p.stem != "__init__"
)
# What the pure core must not load: the server's I/O stack and the metrics library.
NOT_IN_CORE = ("aiohttp", "prometheus_client")
# What `--help` must not load: each costs 0.1-0.8 s of start-up (transformers alone ~0.8 s).
NOT_FOR_HELP = ("transformers", "aiohttp", "pydantic", "prometheus_client", "rich", "tokenizers")


def loaded_after(code: str) -> set[str]:
    """Top-level package names in sys.modules after running `code` in a fresh interpreter."""
    probe = f"{code}\nimport sys, json\nprint(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}})))"
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True, timeout=120
    ).stdout
    return set(json.loads(out.strip().splitlines()[-1]))


def test_core_modules_are_listed() -> None:
    assert {"proxy.core.count", "proxy.core.extract", "proxy.core.usage"} <= set(CORE_MODULES)


@pytest.mark.parametrize("module", CORE_MODULES)
def test_core_imports_neither_aiohttp_nor_prometheus_client(module: str) -> None:
    loaded = loaded_after(f"import {module}")
    assert not loaded & set(NOT_IN_CORE), f"{module} pulls in {sorted(loaded & set(NOT_IN_CORE))}"


def test_the_check_sees_a_heavy_import() -> None:
    """The probe itself is not blind: importing the server does load aiohttp."""
    assert "aiohttp" in loaded_after("import proxy.server.app")


@pytest.mark.parametrize(
    "command", [[], ["count"], ["proxy"], ["emulate"], ["parity"], ["loadgen"], ["demo"]]
)
def test_help_loads_nothing_heavy(command: list[str]) -> None:
    argv = [*command, "--help"]
    code = f"import contextlib, io\nfrom proxy.cli import main\nwith contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):\n    main({argv!r})"
    loaded = loaded_after(code)
    assert not loaded & set(NOT_FOR_HELP), (
        f"islwatch {' '.join(argv)} loads {sorted(loaded & set(NOT_FOR_HELP))}"
    )


@pytest.mark.parametrize("command", ["count", "proxy", "emulate", "parity", "loadgen", "demo"])
def test_help_shows_the_subcommand_flags(command: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "proxy.cli", command, "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert f"usage: islwatch {command}" in out.stdout
    assert "--" in out.stdout.split("options:", 1)[-1]  # its own flags, not just -h
