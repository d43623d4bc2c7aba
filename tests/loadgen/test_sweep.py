"""`--sweep`: one run per load level (rate, concurrency or trace speedup), a summary, and the knee (the highest
point up to which every point met the SLOs); the sweep's JSON, records and CSV outputs, from real runs."""

from __future__ import annotations

import asyncio
import csv
import io
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from rich.console import Console

from loadgen.config import LoadgenConfig
from loadgen.launch import run_loadgen
from loadgen.report.sweep import SweepPoint, knee, point_config
from proxy.emulator.app import EmulatorConfig, start_emulator
from tests.conftest import load_builtin


def point(value: float, meets: bool | None) -> SweepPoint:
    return SweepPoint(value=value, requests=1, succeeded=1, failed=0, request_throughput=1.0,
                      output_token_throughput=1.0, server_exact_rate=1.0, ttft_p50=None, ttft_p99=None,
                      itl_p50=None, itl_p99=None, e2e_p50=None, e2e_p99=None, goodput_share=None,
                      goodput_rate=None, meets_slo=meets)  # fmt: skip


def test_the_knee_is_the_top_of_the_first_run_that_meets() -> None:
    assert knee([point(8, True), point(1, True), point(4, True), point(2, True)]) == 8
    assert knee([point(1, True), point(2, True), point(4, False), point(8, True)]) == 2  # 8 was lucky
    assert knee([point(1, False), point(2, True)]) is None


def test_each_point_replaces_the_swept_flag_and_gets_its_own_run_id() -> None:
    base = {"url": "http://x", "isl": 10, "request_count": 4, "run_id": "r"}
    rate = LoadgenConfig(**base, request_rate=1.0, sweep=[5, 10])
    p = point_config(rate, 10.0, 1)
    assert (p.request_rate, p.run_id, p.sweep) == (10.0, "r-2", None)
    users = point_config(LoadgenConfig(**base, concurrency=1, sweep=[2, 3]), 3.0, 0)
    assert users.concurrency == 3 and isinstance(users.concurrency, int)
    with pytest.raises(ValueError, match="whole numbers of users"):
        LoadgenConfig(**base, concurrency=1, sweep=[1.5])


@pytest.fixture
async def emulator() -> AsyncIterator[str]:
    runner, url = await start_emulator(EmulatorConfig(), tokenizer=load_builtin())
    yield url
    await runner.cleanup()


async def sweep(url: str, tmp_path: Path, **kw: Any) -> tuple[int, dict[str, Any]]:
    out = tmp_path / "sweep.json"
    cfg = LoadgenConfig(**{"url": url, "isl": 80, "osl": 3, "request_count": 6, "output": out,
                           "records": tmp_path / "r.jsonl", "csv": tmp_path / "r.csv", **kw})  # fmt: skip
    code, _ = await asyncio.to_thread(run_loadgen, cfg, Console(file=io.StringIO(), width=200))
    return code, orjson.loads(out.read_bytes())


async def test_rate_sweep_with_slo_finds_the_knee(emulator: str, tmp_path: Path) -> None:
    code, doc = await sweep(emulator, tmp_path, request_rate=1.0, sweep=[300, 100], slo={"e2e_ms": 60_000})
    assert code == 0 and doc["axis"] == "request_rate"
    assert [p["value"] for p in doc["points"]] == [100, 300]  # ascending
    assert all(p["requests"] == 6 and p["server_exact_rate"] == 1.0 and p["meets_slo"] for p in doc["points"])
    assert doc["knee"] == 300
    assert [r["config"]["request_rate"] for r in doc["reports"]] == [100, 300]
    lines = [orjson.loads(x) for x in (tmp_path / "r.jsonl").read_bytes().splitlines()]
    assert sorted({x["point"] for x in lines}) == [100, 300] and len(lines) == 12
    rows = list(csv.DictReader((tmp_path / "r.csv").open()))
    assert len(rows) == 12 and {float(r["point"]) for r in rows} == {100.0, 300.0}
    assert all(r["target_isl"] == r["server_prompt_tokens"] == "80" for r in rows)


async def test_an_unmet_slo_has_no_knee_and_concurrency_is_swept(emulator: str, tmp_path: Path) -> None:
    code, doc = await sweep(emulator, tmp_path, concurrency=1, sweep=[1, 2], slo={"e2e_ms": 1e-6})
    assert code == 0 and doc["axis"] == "concurrency" and doc["knee"] is None
    assert [p["meets_slo"] for p in doc["points"]] == [False, False]
    assert [r["config"]["concurrency"] for r in doc["reports"]] == [1, 2]


async def test_trace_sweep_is_over_the_speedup(emulator: str, tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_bytes(b"".join(orjson.dumps({"timestamp": 100 * i, "input_length": 90 + i, "output_length": 2,
                                             "hash_ids": [1, i + 2]}) + b"\n" for i in range(4)))  # fmt: skip
    code, doc = await sweep(
        emulator, tmp_path, isl=0, request_count=None, trace=trace, block_size=32, sweep=[10, 40]
    )
    assert code == 0 and doc["axis"] == "trace_speedup" and doc["knee"] is None  # no --slo: no knee
    assert [r["config"]["trace_speedup"] for r in doc["reports"]] == [10, 40]
    assert all(r["isl"]["server_exact"] == 4 for r in doc["reports"])


def test_the_flags_reach_the_config() -> None:
    import argparse

    from loadgen import cli
    from loadgen.launch import config_from_args

    p = argparse.ArgumentParser()
    cli.configure(p)
    args = p.parse_args(["--url", "http://x", "--isl", "10", "--request-rate", "5", "--request-count", "4",
                         "--sweep", "5,10,20", "--arrival", "gamma", "--burstiness", "0.5", "--html", "r.html"])  # fmt: skip
    cfg = config_from_args(args)
    assert (cfg.sweep, cfg.arrival, cfg.burstiness, str(cfg.html)) == ([5, 10, 20], "gamma", 0.5, "r.html")
    with pytest.raises(SystemExit):
        p.parse_args(["--url", "http://x", "--sweep", "five"])
