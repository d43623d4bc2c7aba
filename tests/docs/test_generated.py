"""The generated reference pages (docs/reference/, scripts/gen_docs.py) match the code, and the hand-written
pages explain every metric and configuration key the code has."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from proxy.core.causes import CAUSES
from proxy.server.config import ProxyConfig
from proxy.server.metric_families import families
from scripts import gen_docs
from tests.conftest import REPO

DOCS = REPO / "docs"


def exported_names() -> set[str]:
    out = set()
    for metric in families(CollectorRegistry()).values():
        out.add(metric._name + ("_total" if metric._type == "counter" else ""))
    return out


def test_generated_pages_are_fresh() -> None:
    assert gen_docs.stale() == [], "run `python -m scripts.gen_docs` and commit docs/reference/"


def test_check_mode_fails_on_a_stale_page(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--check` is what CI runs: it must notice a page that differs, and one that is missing."""
    for name, render in gen_docs.PAGES.items():
        (tmp_path / name).write_text(render(), encoding="utf-8")
    monkeypatch.setattr(gen_docs, "OUT", tmp_path)
    assert gen_docs.main(["--check"]) == 0
    (tmp_path / "metrics.md").write_text((tmp_path / "metrics.md").read_text().replace("islwatch_drift", "x"))
    (tmp_path / "causes.md").unlink()
    assert gen_docs.stale() == ["docs/reference/metrics.md", "docs/reference/causes.md"]
    assert gen_docs.main(["--check"]) == 1


def test_pages_do_not_depend_on_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """A default read from the environment (`--api-key`: $OPENAI_API_KEY) never reaches a page."""
    before = {name: render() for name, render in gen_docs.PAGES.items()}
    monkeypatch.setenv("OPENAI_API_KEY", "sk-canary-0123456789")
    after = {name: render() for name, render in gen_docs.PAGES.items()}
    assert after == before
    assert not any("sk-canary" in page for page in after.values())


def test_metric_reference_has_every_family_once() -> None:
    page = (DOCS / "reference" / "metrics.md").read_text()
    rows = re.findall(r"^\| `(islwatch_\w+)` \|", page, re.M)
    assert sorted(rows) == sorted(exported_names())


def test_every_metric_is_explained() -> None:
    page = (DOCS / "metrics.md").read_text()
    explained = set(re.findall(r"^- `(islwatch_\w+)`:", page, re.M))
    assert explained == exported_names()


def test_every_config_key_is_explained() -> None:
    page = (DOCS / "proxy.md").read_text()
    explained = set(re.findall(r"^- `(\w+)`", page, re.M))
    assert set(ProxyConfig.model_fields) <= explained


def test_causes_reference_names_every_cause_with_a_rule() -> None:
    page = (DOCS / "reference" / "causes.md").read_text()
    ruled = set(re.findall(r"^\| \d+ \| `(\w+)` \| \S", page, re.M))
    assert ruled == set(CAUSES)


def test_metric_names_in_the_docs_exist() -> None:
    """A metric renamed in the code cannot leave its old name in a page or the README."""
    known = exported_names()
    series = known | {f"{n}_{s}" for n in known for s in ("bucket", "sum", "count", "created")}
    pages = [*DOCS.rglob("*.md"), REPO / "README.md"]
    unknown = {
        (p.relative_to(REPO).as_posix(), name)
        for p in pages
        for name in re.findall(r"(?<![\w#-])islwatch_[a-z_]*[a-z]", p.read_text())
        if name not in series
    }
    assert not unknown
