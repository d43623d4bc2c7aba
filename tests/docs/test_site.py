"""The documentation site builds with `mkdocs build --strict` (a broken link, a missing anchor, a page left out
of the nav or a missing include fails), and its pages display: the home page and the metrics reference are
rendered in headless Chromium (Debian's `chromium`, as tests/loadgen/test_html_report.py renders the loadgen's
report), where a script added to a copy of each page reports, after layout, the title, the tables with their
rows and drawn height, and whether the theme's stylesheet applied. Every local asset a built page refers to
exists."""

from __future__ import annotations

import html
import importlib.util
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import orjson
import pytest

from tests.conftest import REPO, unavailable

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]  # fmt: skip
MEASURE = """<script>
const tables = [...document.querySelectorAll('article table')];
const header = document.querySelector('header.md-header');
const out = {
  title: document.title,
  h1: (document.querySelector('article h1') || {textContent: ''}).textContent,
  tables: tables.map(t => ({rows: t.rows.length, height: t.getBoundingClientRect().height,
                            text: t.textContent.slice(0, 20000)})),
  header: header ? header.getBoundingClientRect().height : 0,
  headerPosition: header ? getComputedStyle(header).position : '',
};
const pre = document.createElement('pre'); pre.id = 'measured'; pre.textContent = JSON.stringify(out);
document.body.appendChild(pre);
</script>"""
# mkdocs and Chromium run as processes (~25 s): the whole suite runs these, `pytest -m fast` leaves them out.
pytestmark = pytest.mark.slow
# src/href attributes of a built page (the measuring copy adds none).
ASSET = re.compile(r"""\b(?:src|href)="([^"]+)\"""")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    for module in ("mkdocs", "material"):
        if importlib.util.find_spec(module) is None:
            unavailable(f"{module} is not installed (pip install -e '.[test]')")
    out = tmp_path_factory.mktemp("site")
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=300, env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert build.returncode == 0, build.stderr[-4000:]
    yield out


def chromium() -> str:
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if binary is None:
        unavailable("chromium is not installed (scripts/test.sh installs Debian's package)")
    return binary


def rendered(page: Path, tmp_path: Path) -> dict[str, Any]:
    # The copy sits beside the page, so its relative links to the theme's assets resolve as the page's do.
    measured = page.with_name(page.stem + ".measured.html")
    measured.write_text(page.read_text().replace("</body>", MEASURE + "</body>"))
    out = subprocess.run(
        [chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", measured.as_uri()],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    measured.unlink()
    found = re.search(r'<pre id="measured">(.*?)</pre>', out.stdout, re.S)
    assert found, out.stderr[-2000:]
    return dict(orjson.loads(html.unescape(found.group(1))))


def local_assets(page: Path) -> set[str]:
    out = set()
    for ref in ASSET.findall(page.read_text()):
        parts = urlsplit(html.unescape(ref))
        if parts.scheme or parts.netloc or not parts.path:
            continue
        out.add(unquote(parts.path))
    return out


def test_build_fails_on_a_broken_link(tmp_path: Path, site: Path) -> None:
    """The strictness is real: a page linking to a missing anchor stops the build."""
    docs = tmp_path / "docs"
    shutil.copytree(REPO / "docs", docs)
    (docs / "index.md").write_text((docs / "index.md").read_text() + "\n[x](metrics.md#no-such-section)\n")
    config = (REPO / "mkdocs.yml").read_text().replace("docs_dir: docs", f"docs_dir: {docs}")
    (tmp_path / "mkdocs.yml").write_text(config)
    (tmp_path / "bench").symlink_to(REPO / "bench")  # the snippets' base path is the config's folder
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(tmp_path / "mkdocs.yml"),
         "--site-dir", str(tmp_path / "out")],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert build.returncode != 0
    assert "no-such-section" in build.stderr


def test_every_local_asset_exists(site: Path) -> None:
    # 404.html is served from the site's root by any web server, so its links are absolute by design.
    pages = sorted(p for p in site.rglob("*.html") if p.name != "404.html")
    assert len(pages) > 30
    missing = {
        (page.relative_to(site).as_posix(), ref)
        for page in pages
        for ref in local_assets(page)
        if not (page.parent / ref).resolve().exists()
    }
    assert not missing


def test_home_page_displays(site: Path, tmp_path: Path) -> None:
    shown = rendered(site / "index.html", tmp_path)
    assert shown["title"] == "islwatch"
    assert shown["h1"].startswith("islwatch")
    assert shown["header"] > 0 and shown["headerPosition"] == "sticky"  # Material's stylesheet applied
    (where,) = shown["tables"]
    assert where["rows"] >= 10 and where["height"] > 100
    assert "Runbooks" in where["text"]


def test_metrics_reference_displays_every_family(site: Path, tmp_path: Path) -> None:
    shown = rendered(site / "reference" / "metrics.html", tmp_path)
    assert shown["title"] == "Metrics - islwatch" and shown["h1"].startswith("Metrics reference")
    catalog, engines = shown["tables"]
    assert catalog["height"] > 500 and engines["height"] > 0
    names = set(re.findall(r"islwatch_\w+", catalog["text"]))
    assert {"islwatch_requests_total", "islwatch_isl_tokens", "islwatch_drift_total"} <= names
    assert catalog["rows"] == 1 + len({n for n in names if not n.endswith(("_sum", "_count", "_bucket"))})
