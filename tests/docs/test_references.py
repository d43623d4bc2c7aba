"""Every file path and Python name the documentation (docs/ and the README) points at exists: a module
moved or renamed in the code cannot leave a page pointing at its old place."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from tests.conftest import REPO

PAGES = sorted([*(REPO / "docs").rglob("*.md"), REPO / "README.md"])
# Repository paths as the pages write them: `proxy/server/handler.py`, `deploy/k8s/`.
PATH = re.compile(r"(?<![\w/.:-])((?:proxy|loadgen|tests|scripts|bench|deploy|grafana)/[\w./-]*\w/?)")
# Dotted Python names in code spans: `proxy.core.count.count_request`, `loadgen.demo.verdicts.firing`.
DOTTED = re.compile(r"`((?:proxy|loadgen|bench|scripts)(?:\.\w+)+)")
IMPORT = re.compile(r"^from ((?:proxy|loadgen)[\w.]*) import ([\w, ]+)$", re.M)
# Not repository paths: outputs and Kubernetes object names.
NOT_PATHS = {"bench/results", "bench/results/", "deploy/llm"}


def page_id(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def resolve(dotted: str) -> bool:
    """The longest importable module prefix (at least `package.module`), then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 1, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_paths_exist(page: Path) -> None:
    missing = sorted(
        {p for p in PATH.findall(page.read_text()) if p not in NOT_PATHS and not (REPO / p).exists()}
    )
    assert not missing


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_python_names_exist(page: Path) -> None:
    text = page.read_text()
    names = {n for n in DOTTED.findall(text) if not n.endswith(".py")}  # `proxy.py` is a file name
    names |= {f"{mod}.{n.strip()}" for mod, imported in IMPORT.findall(text) for n in imported.split(",")}
    missing = sorted(n for n in names if not resolve(n))
    assert not missing


def test_the_checks_catch_a_moved_module() -> None:
    assert resolve("proxy.core.count.count_request")
    assert not resolve("proxy.core.count.no_such_function")
    assert not resolve("loadgen.no_such_module.firing")


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_no_development_history(page: Path) -> None:
    """The pages describe islwatch as it is: not which issue or session changed what."""
    found = re.findall(r"(?i)\bissue[ -]?\d+|\bthis session\b|\bsession's start\b", page.read_text())
    assert not found


def test_the_readme_shows_the_compatibility_pages_matrix() -> None:
    """The family x server x version table is written twice, for the README and the site: the same table."""

    def matrix(text: str) -> str:
        start = text.index("| family | vLLM")
        return text[start : text.index("\n\n", start)]

    readme = (REPO / "README.md").read_text()
    assert matrix(readme) == matrix((REPO / "docs" / "compatibility" / "index.md").read_text())
