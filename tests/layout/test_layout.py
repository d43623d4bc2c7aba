"""The layout's rules, held by tests: the counting core is pure, and `--help` loads nothing heavy.

Checked in fresh interpreters, so an import anywhere down the chain counts (a static grep would miss a
transitive import); each core module in a child forked from one interpreter that loaded only the heavy
libraries the core may use.
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


def test_no_import_changes_another_librarys_behaviour() -> None:
    """Importing every module of proxy and loadgen leaves aiohttp's head serializer as aiohttp set it: the
    proxy installs its own at start-up (app.start_servers), so the loadgen keeps aiohttp's C serializer."""
    modules = sorted(
        ".".join(p.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        for root in ("proxy", "loadgen")
        for p in (REPO / root).rglob("*.py")
        if p.stem != "__main__"
    )
    probe = (
        "import importlib, sys\nfrom aiohttp import http_writer\nbefore = http_writer._serialize_headers\n"
        f"for m in {modules!r}:\n    importlib.import_module(m)\n"
        "print(http_writer._serialize_headers is before, http_writer._serialize_headers.__module__)"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True, timeout=300
    )
    assert out.stdout.split() == ["True", "aiohttp._http_writer"], out.stdout


def test_core_modules_are_listed() -> None:
    assert {"proxy.core.count", "proxy.core.extract", "proxy.core.usage"} <= set(CORE_MODULES)


# The heavy libraries the core may load, imported once by the probe below before it forks a child per core
# module: what a module pulls in on top of them still shows, and the probe checks that they load none of
# NOT_IN_CORE themselves (else every child would carry it).
CORE_MAY_LOAD = ("jinja2", "numpy", "PIL.Image", "tokenizers", "transformers")
SERVER_APP = "proxy.server.app"
CORE_PROBE = """
import importlib, json, os, sys
def top():
    return sorted({m.split(".")[0] for m in sys.modules})
for name in %r:
    importlib.import_module(name)
print(json.dumps(["", top()]), flush=True)
for module in %r:
    pid = os.fork()
    if pid == 0:
        importlib.import_module(module)
        print(json.dumps([module, top()]), flush=True)
        os._exit(0)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0, module
"""


@pytest.fixture(scope="module")
def core_loads() -> dict[str, set[str]]:
    """Top-level package names loaded after importing each core module (and the server's app), in a child
    forked from one probe interpreter that loaded only CORE_MAY_LOAD (key "": the probe's own)."""
    out = subprocess.run(
        [sys.executable, "-c", CORE_PROBE % (CORE_MAY_LOAD, [*CORE_MODULES, SERVER_APP])],
        cwd=REPO, capture_output=True, text=True, check=True, timeout=300,
    ).stdout  # fmt: skip
    return {name: set(loaded) for name, loaded in map(json.loads, out.strip().splitlines())}


def test_the_core_probe_starts_clean(core_loads: dict[str, set[str]]) -> None:
    assert not core_loads[""] & set(NOT_IN_CORE), sorted(core_loads[""] & set(NOT_IN_CORE))
    assert {"transformers", "tokenizers"} <= core_loads[""]
    assert set(core_loads) == {"", *CORE_MODULES, SERVER_APP}
    assert "aiohttp" in core_loads[SERVER_APP]  # nor is the forked probe blind


@pytest.mark.parametrize("module", CORE_MODULES)
def test_core_imports_neither_aiohttp_nor_prometheus_client(
    module: str, core_loads: dict[str, set[str]]
) -> None:
    loaded = core_loads[module]
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
