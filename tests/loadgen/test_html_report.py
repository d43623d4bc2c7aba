"""`--html` and `--csv` from real runs against the emulator. The page is self-contained (no script, nothing
fetched), and rendered in headless Chromium (Debian's `chromium`): a measuring script added to a copy of the
page reports, after layout, every chart's size and each series' marks with their bounding boxes, which must
be drawn (non-empty) and inside the chart's plot frame."""

from __future__ import annotations

import asyncio
import csv
import html
import io
import re
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from rich.console import Console

from loadgen.config import LoadgenConfig
from loadgen.launch import run_loadgen
from loadgen.report.csv_out import columns
from loadgen.send.replies import Record
from proxy.emulator.app import EmulatorConfig, start_emulator
from proxy.emulator.faults import Faults
from tests.conftest import load_builtin

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]  # fmt: skip
# Runs after layout: sizes of every chart, and per series its marks, the marks with a non-empty box, the points
# of its polyline and whether its box lies inside the chart's plot frame (2 px for strokes and dot radii).
MEASURE = """<script>
const out = [];
for (const svg of document.querySelectorAll('svg.chart')) {
  const box = svg.getBoundingClientRect();
  const frame = (svg.querySelector('rect.plot') || svg).getBoundingClientRect();
  const series = [...svg.querySelectorAll('g.series')].map(g => {
    const marks = [...g.querySelectorAll('circle,rect,polyline')];
    const drawn = marks.filter(m => { const b = m.getBBox(); return b.width > 0 || b.height > 0; }).length;
    const line = g.querySelector('polyline');
    const b = g.getBoundingClientRect();
    const inside = b.left >= frame.left - 5 && b.right <= frame.right + 5 && b.top >= frame.top - 5
      && b.bottom <= frame.bottom + 5;
    return {name: g.dataset.series, n: +g.dataset.n, marks: marks.length, drawn,
            points: line ? line.points.numberOfItems : null, inside};
  });
  out.push({chart: svg.dataset.chart, width: box.width, height: box.height, series});
}
const pre = document.createElement('pre'); pre.id = 'measured'; pre.textContent = JSON.stringify(out);
document.body.appendChild(pre);
</script>"""


@pytest.fixture
async def emulator() -> AsyncIterator[str]:
    runner, url = await start_emulator(EmulatorConfig(), tokenizer=load_builtin())
    yield url
    await runner.cleanup()


async def loadgen(url: str, **kw: Any) -> int:
    cfg = LoadgenConfig(**{"url": url, "isl": 90, "osl": 4, "streaming": True, **kw})
    code, _ = await asyncio.to_thread(run_loadgen, cfg, Console(file=io.StringIO(), width=200))
    return code


def chromium() -> str:
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if binary is None:
        pytest.skip("chromium is not installed (scripts/test.sh installs Debian's package)")
    return binary


def rendered(page: Path, tmp_path: Path) -> list[dict[str, Any]]:
    measured = tmp_path / "measured.html"
    measured.write_text(page.read_text().replace("</body>", MEASURE + "</body>"))
    profile = tmp_path / "chromium-profile"
    out = subprocess.run(
        [chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--dump-dom", measured.as_uri()],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    found = re.search(r'<pre id="measured">(.*?)</pre>', out.stdout, re.S)
    assert found, out.stderr[-2000:]
    return list(orjson.loads(html.unescape(found.group(1))))


async def test_the_page_is_self_contained_and_chromium_draws_every_chart(tmp_path: Path) -> None:
    faults = Faults(status=503, status_rate=0.25)  # some failed requests, so the error bars are drawn too
    runner, url = await start_emulator(EmulatorConfig(faults=faults), tokenizer=load_builtin())
    page, out = tmp_path / "report.html", tmp_path / "sweep.json"
    try:
        code = await loadgen(url, concurrency=2, request_count=12, turns=2, sweep=[1, 2], slo={"e2e_ms": 60_000},
                             html=page, output=out)  # fmt: skip
    finally:
        await runner.cleanup()
    assert code == 1  # some requests failed
    reports = orjson.loads(out.read_bytes())["reports"]
    text = page.read_text()
    assert "<script" not in text and not re.search(r"""(src|href)=["']?(https?:)?//""", text)
    charts = rendered(page, tmp_path)
    names = [c["chart"] for c in charts]
    assert names[:2] == ["sweep-throughput", "sweep-latency"]
    per_run = ["isl-scatter", "isl-exact", "cdf-ttft", "cdf-itl", "cdf-e2e", "timeline"]
    assert names[2:] == per_run * 2  # one section per sweep point
    for c in charts:
        assert c["width"] > 100 and c["height"] > 50, c
        for s in c["series"]:
            assert s["marks"] and s["drawn"] == s["marks"], (c["chart"], s)
            assert s["inside"], (c["chart"], s)
    for i, c in enumerate(charts[2:]):
        report = reports[i // len(per_run)]
        ok, failed = report["succeeded"], report["failed"]
        assert ok and failed and ok + failed == 12
        series = {s["name"]: s for s in c["series"]}
        if c["chart"] == "isl-scatter":  # one ring per request built, one dot per server count (the ok ones)
            assert series["client templated"]["marks"] == 12 and series["server usage"]["marks"] == ok
        if c["chart"].startswith("cdf-"):  # a step per ok request, rising from 0
            (line,) = series.values()
            assert line["n"] == ok and line["points"] == 2 * ok
        if c["chart"] == "isl-exact":
            assert series["isl-exact"]["marks"] == 2  # client and server (no proxy here)
        if c["chart"] == "timeline":
            assert 1 <= series["errors"]["marks"] <= failed
    sweep_lines = {s["name"]: s for s in charts[0]["series"]}
    assert sweep_lines["achieved req/s"]["n"] == sweep_lines["goodput req/s"]["n"] == 2


async def test_csv_has_a_row_per_request_with_the_records_fields(emulator: str, tmp_path: Path) -> None:
    out = tmp_path / "r.csv"
    assert await loadgen(emulator, concurrency=1, request_count=5, csv=out, records=tmp_path / "r.jsonl") == 0
    rows = list(csv.DictReader(out.open()))
    assert list(rows[0]) == columns(sweep=False) == list(Record.__dataclass_fields__)
    records = [orjson.loads(x) for x in (tmp_path / "r.jsonl").read_bytes().splitlines()]
    assert [r["conversation"] for r in rows] == [r["conversation"] for r in records]
    assert all(r["target_isl"] == r["server_prompt_tokens"] == "90" and r["error"] == "" for r in rows)
