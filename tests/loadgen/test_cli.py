"""`islwatch loadgen` as a user runs it: a subprocess against `islwatch emulate`, JSON report and records;
and its command line parsed without the heavy imports, so `--help` is fast."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from tests.conftest import REPO
from tests.lanes import sweep
from tests.reliability.reliability_peers import running, start_emulator

CLI = [sys.executable, "-m", "proxy.cli"]
HEAVY = ("transformers", "tokenizers", "jinja2", "pydantic", "rich", "aiohttp", "prometheus_client")
# Parsing the command line (and --help) must not load what only running needs.
CONFIGURE_ONLY = """
import argparse, sys
from loadgen import cli
from loadgen.demo import cli as demo
for mod in (cli, demo):
    mod.configure(argparse.ArgumentParser())
print(" ".join(sorted(m for m in sys.modules if m.split(".")[0] in {heavy})))
"""


@pytest.fixture(scope="module")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running(start_emulator(tmp_path_factory.mktemp("emulate") / "emulate.log")) as child:
        yield child.url


def test_configure_needs_no_heavy_imports() -> None:
    code = CONFIGURE_ONLY.format(heavy=set(HEAVY))
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == []


@pytest.mark.parametrize("workers", sweep([1, 2]))
def test_loadgen_cli_writes_report_and_records(emulator: str, tmp_path: Path, workers: int) -> None:
    out = subprocess.run(
        [*CLI, "loadgen", "--url", emulator, "--isl", "150", "--osl", "4", "--turns", "2", "--request-rate", "50",
         "--arrival", "constant", "--request-count", "8", "--warmup", "1", "--streaming", "--workers", str(workers),
         "--cache-bust", "first_turn_suffix", "--output", str(tmp_path / "r.json"),
         "--records", str(tmp_path / "r.jsonl")],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "template overhead: fixed" in out.stdout
    report = orjson.loads((tmp_path / "r.json").read_bytes())
    assert report["requests"] == 8 and report["warmup_excluded"] == 1
    assert report["isl"]["client_exact"] == report["isl"]["server_exact"] == 8
    assert report["ttft_ms"]["n"] == 8 and report["send_lateness_ms"]["n"] == 8
    records = [orjson.loads(line) for line in (tmp_path / "r.jsonl").read_bytes().splitlines()]
    assert len(records) == 9
    for r in records:
        for key in (
            "turn",
            "target_isl",
            "client_isl",
            "server_prompt_tokens",
            "latency_ms",
            "ttft_ms",
            "itl_ms",
        ):
            assert key in r
        assert r["client_isl"] == r["target_isl"] == r["server_prompt_tokens"]
    assert {r["turn"] for r in records if not r["warmup"]} == {1, 2}
