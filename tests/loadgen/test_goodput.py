"""Goodput against --slo: vLLM's rule (a request is good when every bounded metric is at most its bound),
failed and unmeasured requests never good, share and rate; the flag's parsing and refusals; a real run."""

from __future__ import annotations

import argparse
import asyncio
import io
from collections.abc import AsyncIterator
from typing import Any

import pytest
from rich.console import Console

from loadgen import cli
from loadgen.config import LoadgenConfig
from loadgen.report.goodput import attained, goodput, meets
from loadgen.send.orchestrate import prepare, run_config
from loadgen.send.replies import Record
from proxy.emulator.app import EmulatorConfig, start_emulator
from tests.conftest import load_builtin

SLO = {"ttft_ms": 100.0, "itl_ms": 10.0, "e2e_ms": 1000.0}


def rec(**kw: Any) -> Record:
    base: dict[str, Any] = dict(
        conversation="c0", turn=1, warmup=False, turn_isl=10, target_isl=10, client_isl=10,
        server_prompt_tokens=10, reply_tokens=0, output_tokens=5, status=200, error=None, budget_error=None,
        sent_at=0.0, scheduled_at=None, send_lateness_ms=None, latency_ms=500.0, ttft_ms=50.0, itl_ms=5.0,
    )  # fmt: skip
    fields = set(Record.__dataclass_fields__)
    return Record(**{k: v for k, v in {**base, **kw}.items() if k in fields})


def test_a_request_at_its_bounds_is_good() -> None:
    assert meets(rec(ttft_ms=100.0, itl_ms=10.0, latency_ms=1000.0), SLO)  # vLLM: good when slo >= metric


@pytest.mark.parametrize(
    "kw",
    [{"ttft_ms": 100.5}, {"itl_ms": 10.01}, {"latency_ms": 1001.0}, {"itl_ms": None}, {"status": 500},
     {"error": "ClientOSError"}],
)  # fmt: skip
def test_one_miss_unmeasured_or_failed_is_not_good(kw: dict[str, Any]) -> None:
    assert not meets(rec(**kw), SLO)


def test_share_rate_and_misses_per_slo() -> None:
    records = [
        rec(),
        rec(),
        rec(ttft_ms=300.0),
        rec(ttft_ms=300.0, latency_ms=2000.0),
        rec(warmup=True, ttft_ms=1e9),
    ]
    g = goodput(records, SLO, duration_s=2.0)
    assert (g.requests, g.good, g.share, g.rate) == (4, 2, 0.5, 1.0)
    assert g.missed == {"ttft_ms": 2, "itl_ms": 0, "e2e_ms": 1}
    assert attained(g, 0.5) and not attained(g, 0.51)


def test_only_bounded_metrics_count() -> None:
    assert meets(rec(ttft_ms=None, itl_ms=None), {"e2e_ms": 600.0})


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    cli.configure(p)
    return p.parse_args(
        ["--url", "http://x", "--isl", "10", "--concurrency", "1", "--request-count", "1", *argv]
    )


def test_the_flag_parses_names_and_values() -> None:
    assert parse(["--slo", "ttft_ms=500, e2e_ms=2000.5"]).slo == {"ttft_ms": 500.0, "e2e_ms": 2000.5}
    with pytest.raises(SystemExit):
        parse(["--slo", "ttft_ms"])


@pytest.mark.parametrize(
    ("slo", "kw", "message"),
    [({"ttft_ms": 5.0}, {}, "needs --streaming"), ({"p99": 5.0}, {"streaming": True}, "--slo takes ttft_ms"),
     ({"e2e_ms": -1.0}, {}, "positive")],
)  # fmt: skip
def test_refused(slo: dict[str, float], kw: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LoadgenConfig(url="http://x", isl=10, concurrency=1, request_count=1, slo=slo, **kw)


@pytest.fixture
async def emulator() -> AsyncIterator[str]:
    runner, url = await start_emulator(EmulatorConfig(), tokenizer=load_builtin())
    yield url
    await runner.cleanup()


@pytest.mark.parametrize(("bound", "good"), [(60_000.0, 8), (1e-6, 0)])
async def test_a_real_runs_report_carries_goodput(emulator: str, bound: float, good: int) -> None:
    cfg = LoadgenConfig(url=emulator, isl=64, osl=4, concurrency=2, request_count=8, streaming=True,
                        slo={"ttft_ms": bound, "e2e_ms": bound})  # fmt: skip
    prepared = prepare(cfg)
    console = Console(file=io.StringIO())
    _, report = await asyncio.to_thread(run_config, cfg, prepared, console)  # its own loop
    assert report.goodput is not None
    assert (report.goodput.requests, report.goodput.good) == (8, good)
    assert report.goodput.rate == pytest.approx(good / report.duration_s)
