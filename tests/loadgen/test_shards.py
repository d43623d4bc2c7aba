"""`--shard I/N` and `islwatch loadgen merge`: N real `islwatch loadgen` processes against `islwatch emulate`
send what one process sends (totals, exactness, request ids), and the merge of their records is the one
report: percentiles over every record, checked against numpy on the concatenated records files, shards of
another machine's clocks lined up, and shards that do not make one run refused."""

from __future__ import annotations

import io
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from rich.console import Console

from loadgen.config import LoadgenConfig
from loadgen.report.merge import run_merge
from loadgen.report.model import build_report
from loadgen.report.shard_dir import Clock, write_shard
from loadgen.send.replies import Record
from loadgen.shards import parse_shard, shard_senders, shard_share, share
from proxy.runtime.children import free_port
from tests.conftest import REPO, shared_dir
from tests.reliability.reliability_peers import running, start_emulator

CLI = [sys.executable, "-m", "proxy.cli"]
SHARDS = 3
# One workload, sent open loop (Poisson arrivals) and closed loop; single-turn, so every id is settled by
# the request count alone (a multi-turn run's conversations depend on which user takes the last request).
WORKLOADS = {
    "open": ["--request-rate", "90", "--arrival", "poisson", "--request-count", "31", "--warmup", "2"],
    "closed": ["--concurrency", "4", "--request-count", "25"],
}
COMMON = [
    "--isl",
    "120",
    "--isl-stddev",
    "20",
    "--osl",
    "3",
    "--seed",
    "7",
    "--cache-bust",
    "first_turn_suffix",
]


@pytest.fixture(scope="module")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running(start_emulator(tmp_path_factory.mktemp("emulate") / "emulate.log")) as child:
        yield child.url


def _finish(proc: subprocess.Popen[str]) -> None:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-2000:] + err[-2000:]


def loadgen(url: str, shape: str, run_id: str, *extra: str) -> subprocess.Popen[str]:
    args = [*CLI, "loadgen", "--url", url, *COMMON, *WORKLOADS[shape], "--run-id", run_id, *extra]
    return subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def merge(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, "loadgen", "merge", *map(str, args)], cwd=REPO, capture_output=True, text=True, timeout=120
    )


def merge_here(capsys: pytest.CaptureFixture[str], *dirs: Path) -> tuple[int, str]:
    """`islwatch loadgen merge DIR...` in this process (the command's own function; the CLI itself runs in
    the `runs` fixture): its exit code and what it printed to stderr."""
    code = run_merge(list(dirs), {}, Console(file=io.StringIO()))
    return code, capsys.readouterr().err


def jsonl(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


@pytest.fixture(scope="module", params=list(WORKLOADS))
def runs(
    request: pytest.FixtureRequest, emulator: str, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    """The workload sent by SHARDS shard processes at once, and by one process; merged with the CLI."""
    shape = request.param
    tmp = tmp_path_factory.mktemp(f"shards-{shape}")
    run_id = f"shards-{shape}"
    procs = [
        loadgen(emulator, shape, run_id, "--shard", f"{i}/{SHARDS}", "--run-dir", str(tmp / "run"))
        for i in range(SHARDS)
    ]
    one = loadgen(
        emulator, shape, run_id, "--output", str(tmp / "one.json"), "--records", str(tmp / "one.jsonl")
    )
    for p in [*procs, one]:
        _finish(p)
    out = merge(tmp / "run", "--output", tmp / "merged.json", "--records", tmp / "merged.jsonl",
                "--csv", tmp / "merged.csv", "--html", tmp / "merged.html")  # fmt: skip
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    return {"dir": tmp, "merge_stdout": out.stdout, "one": orjson.loads((tmp / "one.json").read_bytes()),
            "merged": orjson.loads((tmp / "merged.json").read_bytes())}  # fmt: skip


def ids(records: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """What names and sizes a request: its conversation id (which also picks its marker and prompt seed),
    turn, warmup flag, and its budget and measured counts."""
    keys = ("conversation", "turn", "warmup", "turn_isl", "target_isl", "client_isl")
    return sorted(tuple(r[k] for k in keys) for r in records)


@pytest.mark.slow
def test_shards_send_what_one_process_sends(runs: dict[str, Any]) -> None:
    one, merged, tmp = runs["one"], runs["merged"], runs["dir"]
    for key in ("requests", "succeeded", "failed", "warmup_excluded"):
        assert merged[key] == one[key], key
    assert merged["requests"] == one["config"]["request_count"] and merged["failed"] == 0
    for key in ("client_exact", "server_reported", "server_exact", "budget_errors"):
        assert merged["isl"][key] == one["isl"][key], key
    assert merged["isl"]["server_exact"] == merged["requests"]
    assert merged["isl"]["target_mean"] == pytest.approx(one["isl"]["target_mean"])
    assert merged["config"]["shards"] == SHARDS and merged["run_id"] == one["run_id"]
    shard_records = [jsonl(d / "records.jsonl") for d in sorted((tmp / "run").iterdir())]
    assert [len(rs) for rs in shard_records] and all(shard_records)  # every shard sent a part
    union = [r for rs in shard_records for r in rs]
    assert len({r["conversation"] for r in union}) == len(union)  # disjoint: no request sent twice
    assert ids(union) == ids(jsonl(tmp / "one.jsonl")) == ids(jsonl(tmp / "merged.jsonl"))
    assert "ISL: target vs achieved" in runs["merge_stdout"]
    csv_rows = (tmp / "merged.csv").read_text().splitlines()
    assert len(csv_rows) == 1 + len(union)
    assert f"run {runs['one']['run_id']}" in (tmp / "merged.html").read_text()


def _wall(rec: dict[str, Any], clock: dict[str, float]) -> float:
    return float(rec["sent_at"]) + clock["wall_s"] - clock["monotonic_s"]


@pytest.mark.slow
def test_merged_percentiles_are_over_all_records(runs: dict[str, Any]) -> None:
    tmp, merged = runs["dir"], runs["merged"]
    latencies: list[float] = []
    starts, ends = [], []
    for d in sorted((tmp / "run").iterdir()):
        clock = orjson.loads((d / "clock.json").read_bytes())
        for r in jsonl(d / "records.jsonl"):
            if r["warmup"]:
                continue
            latencies.append(r["latency_ms"])
            starts.append(_wall(r, clock))
            ends.append(_wall(r, clock) + r["latency_ms"] / 1000)
    assert merged["latency_ms"]["n"] == len(latencies)
    for name, q in (("p50", 50), ("p90", 90), ("p99", 99)):
        assert merged["latency_ms"][name] == pytest.approx(float(np.percentile(latencies, q)), rel=1e-9)
    assert merged["latency_ms"]["mean"] == pytest.approx(float(np.mean(latencies)), rel=1e-9)
    assert merged["latency_ms"]["max"] == max(latencies)
    # The run's span on the wall clock: from the first send of any shard to the last answer of any.
    assert merged["duration_s"] == pytest.approx(max(ends) - min(starts), abs=1e-6)


@pytest.mark.slow
def test_merge_lines_up_a_machine_with_another_monotonic_clock(runs: dict[str, Any], tmp_path: Path) -> None:
    """Shard 1 moved to a machine whose monotonic clock reads 5000 s more at the same wall time: its records
    and its clock.json say so, and the merged report is the same."""
    run = shutil.copytree(runs["dir"] / "run", tmp_path / "run")
    shard = run / f"shard-1-of-{SHARDS}"
    clock = orjson.loads((shard / "clock.json").read_bytes())
    clock["monotonic_s"] += 5000.0
    (shard / "clock.json").write_bytes(orjson.dumps(clock))
    moved = []
    for r in jsonl(shard / "records.jsonl"):
        r["sent_at"] += 5000.0
        if r["scheduled_at"] is not None:
            r["scheduled_at"] += 5000.0
        moved.append(orjson.dumps(r))
    (shard / "records.jsonl").write_bytes(b"\n".join(moved) + b"\n")
    out = merge(run, "--output", tmp_path / "m.json")
    assert out.returncode == 0, out.stderr
    again = orjson.loads((tmp_path / "m.json").read_bytes())
    assert again["duration_s"] == pytest.approx(runs["merged"]["duration_s"], abs=1e-6)
    assert again["latency_ms"] == runs["merged"]["latency_ms"]
    # Without the clock the shard's sends would sit 5000 s away: the span shows it was used.
    assert again["duration_s"] < 1000


# An agent workload: qwen3 (native parallel tool calls, reasoning kept), closed loop with one user per sender
# and whole conversations per sender, so which conversations are sent is settled by the split alone.
AGENT_ROUNDS, AGENT_ISL, AGENT_ROUND = 3, 800, 150
AGENT = ["--workload", "agent", "--isl", str(AGENT_ISL), "--round-isl", str(AGENT_ROUND), "--agent-rounds",
         str(AGENT_ROUNDS), "--tools", "4", "--parallel-calls", "2", "--osl", "3", "--seed", "7", "--cache-bust",
         "first_turn_prefix", "--concurrency", "2", "--request-count", str(2 * 2 * (AGENT_ROUNDS + 1))]  # fmt: skip


@pytest.fixture(scope="module")
def qwen3_emulator() -> Iterator[str]:
    port = free_port("127.0.0.1", 0)
    args = [*CLI, "emulate", "--listen", f"127.0.0.1:{port}", "--tokenizer", str(shared_dir("qwen3"))]
    proc = subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert "listening on" in line, line
    yield f"http://127.0.0.1:{port}"
    proc.terminate()
    proc.wait(timeout=30)


def agent_loadgen(url: str, run_id: str, *extra: str) -> subprocess.Popen[str]:
    args = [*CLI, "loadgen", "--url", url, "--tokenizer", str(shared_dir("qwen3")), *AGENT, "--run-id", run_id,
            *extra]  # fmt: skip
    return subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_agent_shards_send_what_one_process_sends(qwen3_emulator: str, tmp_path: Path) -> None:
    """2 shard processes of an agent workload, merged, against one process with as many senders (--workers
    2): the same totals, request ids, exactness, and per-round table (target vs achieved per round)."""
    run_id = "shards-agent"
    procs = [agent_loadgen(qwen3_emulator, run_id, "--shard", f"{i}/2", "--run-dir", str(tmp_path / "run"))
             for i in range(2)]  # fmt: skip
    one = agent_loadgen(qwen3_emulator, run_id, "--workers", "2", "--output", str(tmp_path / "one.json"),
                        "--records", str(tmp_path / "one.jsonl"))  # fmt: skip
    for p in [*procs, one]:
        _finish(p)
    out = merge(
        tmp_path / "run", "--output", tmp_path / "merged.json", "--records", tmp_path / "merged.jsonl"
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    one_report, merged = (orjson.loads((tmp_path / f"{n}.json").read_bytes()) for n in ("one", "merged"))
    for key in ("requests", "succeeded", "failed"):
        assert merged[key] == one_report[key], key
    assert merged["requests"] == 16 and merged["failed"] == 0
    for key in ("client_exact", "server_reported", "server_exact", "budget_errors"):
        assert merged["isl"][key] == one_report["isl"][key], key
    assert merged["isl"]["server_exact"] == 16 and merged["isl"]["budget_errors"] == 0
    shard_records = [jsonl(d / "records.jsonl") for d in sorted((tmp_path / "run").iterdir())]
    assert all(shard_records) and not {r["conversation"] for r in shard_records[0]} & {
        r["conversation"] for r in shard_records[1]
    }  # each shard its own conversations
    merged_records = jsonl(tmp_path / "merged.jsonl")
    assert ids(merged_records) == ids(jsonl(tmp_path / "one.jsonl"))
    assert sorted({r["conversation"] for r in merged_records}) == ["c0", "c1", "c2", "c3"]
    for r in merged_records:
        assert r["server_prompt_tokens"] == r["target_isl"] == AGENT_ISL + (r["turn"] - 1) * AGENT_ROUND, r

    def rounds(report: dict[str, Any]) -> list[dict[str, Any]]:  # the prefix cache share aside: the two
        return [{k: v for k, v in t.items() if k != "cache"} for t in report["turns"]]  # runs share a cache

    assert rounds(merged) == rounds(one_report)
    assert [t["target_mean"] for t in rounds(merged)] == [AGENT_ISL + k * AGENT_ROUND for k in range(4)]
    assert all(t["server_exact_rate"] == 1.0 and t["requests"] == 4 for t in rounds(merged))
    assert "per round: target vs achieved" in out.stdout


# --- refusals, on shard folders written by the code the loadgen uses (no processes needed) --------------------


def record(i: int, latency: float) -> Record:
    return Record(
        conversation=f"c{i}", turn=1, warmup=False, turn_isl=10, target_isl=10, client_isl=10,
        server_prompt_tokens=10, reply_tokens=0, output_tokens=2, status=200, error=None, budget_error=None,
        sent_at=100.0 + i, scheduled_at=None, send_lateness_ms=None, latency_ms=latency, ttft_ms=None,
        itl_ms=None,
    )  # fmt: skip


def fake_shard(run_dir: Path, index: int, count: int, **config: Any) -> Path:
    cfg = LoadgenConfig(url="http://127.0.0.1:1", isl=10, concurrency=count, request_count=2 * count,
                        run_id="r1", shard=f"{index}/{count}", **config)  # fmt: skip
    records = [record(i, 10.0 * (i + 1)) for i in range(index, 2 * count, count)]
    report = build_report(records, run_id=cfg.run_id, config=cfg.model_dump(mode="json", exclude={"api_key"}),
                          tokenizer={"name": "t"}, overhead=None)  # fmt: skip
    return write_shard(run_dir, index, count, report, records, Clock(wall_s=1000.0, monotonic_s=100.0))


def test_merge_of_fake_shards_is_their_union(tmp_path: Path) -> None:
    for i in range(3):
        fake_shard(tmp_path / "run", i, 3)
    out = merge(tmp_path / "run", "--output", tmp_path / "m.json")
    assert out.returncode == 0, out.stderr
    report = orjson.loads((tmp_path / "m.json").read_bytes())
    assert report["requests"] == 6 and report["latency_ms"]["p50"] == float(
        np.percentile([10, 20, 30, 40, 50, 60], 50)
    )


def test_merge_refuses_shards_of_different_setups(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fake_shard(tmp_path / "run", 0, 2)
    fake_shard(tmp_path / "run", 1, 2, osl=64)
    code, err = merge_here(capsys, tmp_path / "run")
    assert code == 2
    assert "different setups" in err and "osl" in err


def test_merge_refuses_a_shard_given_twice(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fake_shard(tmp_path / "a", 0, 2)
    fake_shard(tmp_path / "a", 1, 2)
    fake_shard(tmp_path / "b", 1, 2)
    code, err = merge_here(capsys, tmp_path / "a", tmp_path / "b")
    assert code == 2 and "1 of 2 given more than once" in err


def test_merge_refuses_a_missing_shard(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fake_shard(tmp_path / "run", 0, 3)
    fake_shard(tmp_path / "run", 2, 3)
    code, err = merge_here(capsys, tmp_path / "run")
    assert code == 2 and "shard(s) 1 of 3 missing" in err


def test_merge_refuses_shards_of_different_splits(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fake_shard(tmp_path / "run", 0, 2)
    fake_shard(tmp_path / "run", 1, 3)
    code, err = merge_here(capsys, tmp_path / "run")
    assert code == 2 and "shard of" in err


def test_merge_refuses_a_folder_without_shards(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = merge_here(capsys, tmp_path)
    assert code == 2 and "no finished shard" in err


# --- the split itself -------------------------------------------------------------------------------------


# Totals of at least one request per sender: fewer is refused (test_shard_flag_and_config_refuse_...).
SPLITS = [(t, c, w) for t in (1, 7, 31, 100) for c, w in ((1, 1), (3, 1), (3, 2), (4, 3)) if t >= c * w]


@pytest.mark.parametrize(("total", "count", "workers"), SPLITS)
def test_shards_split_every_total_exactly_once(total: int, count: int, workers: int) -> None:
    senders = [s for i in range(count) for s in shard_senders(i, count, workers)]
    assert senders == list(range(count * workers))  # each sender in exactly one shard
    assert sum(shard_share(total, i, count, workers) for i in range(count)) == total
    # The conversations a sender numbers (c<k*S+s>, k < its share) cover 0..total-1 once.
    numbered = sorted(k * len(senders) + s for s in senders for k in range(share(total, s, len(senders))))
    assert numbered == list(range(total))


def test_shard_flag_and_config_refuse_what_cannot_split() -> None:
    with pytest.raises(ValueError, match="counts from 0 to 3"):
        parse_shard("4/4")
    with pytest.raises(ValueError, match="give I/N"):
        parse_shard("1-4")
    base: dict[str, Any] = {"url": "http://x", "isl": 10, "concurrency": 4, "request_count": 8}
    with pytest.raises(ValueError, match="needs --run-id"):
        LoadgenConfig(**base, shard="1/4")
    with pytest.raises(ValueError, match="smaller than 8 senders"):
        LoadgenConfig(**{**base, "request_count": 4}, shard="1/4", workers=2, run_id="r")
    assert LoadgenConfig(**base, shard="3/4", run_id="r").senders == 4
