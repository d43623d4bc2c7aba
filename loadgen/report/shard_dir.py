"""`--run-dir DIR`: what one shard leaves for `islwatch loadgen merge`, and reading it back.

`DIR/shard-I-of-N/` holds `records.jsonl` (one Record a line, warmup included, times on this machine's
monotonic clock), `clock.json` (the wall clock and the monotonic clock read together, so shards on different
machines land on one timeline) and `setup.json` (the run's config, tokenizer identity and template overhead).
`setup.json` is written last, by a rename: a folder with it holds a finished shard.
"""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from loadgen.report.model import LoadgenReport
from loadgen.send.replies import Record

FORMAT = 1
RECORDS, SETUP, CLOCK = "records.jsonl", "setup.json", "clock.json"


@dataclass(frozen=True)
class Clock:
    wall_s: float  # time.time()
    monotonic_s: float  # time.monotonic() at the same moment

    @property
    def offset_s(self) -> float:
        """Add to a monotonic time of this machine to get its wall-clock time."""
        return self.wall_s - self.monotonic_s


def read_clock(tries: int = 5) -> Clock:
    """Both clocks, from the try whose two monotonic reads around the wall read are closest together."""
    best: tuple[float, float, float] | None = None
    for _ in range(tries):
        m0 = time.monotonic()
        wall = time.time()
        m1 = time.monotonic()
        if best is None or m1 - m0 < best[0]:
            best = (m1 - m0, wall, (m0 + m1) / 2)
    assert best is not None
    return Clock(wall_s=best[1], monotonic_s=best[2])


def shard_name(index: int, count: int) -> str:
    return f"shard-{index}-of-{count}"


@dataclass(frozen=True)
class Shard:
    path: Path
    index: int
    count: int
    run_id: str
    config: dict[str, Any]
    tokenizer: dict[str, Any]
    overhead: dict[str, float] | None
    clock: Clock
    records: list[Record]


def write_shard(
    run_dir: Path, index: int, count: int, report: LoadgenReport, records: list[Record], clock: Clock
) -> Path:
    """Write one shard's folder under `run_dir`; returns it."""
    folder = run_dir / shard_name(index, count)
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / RECORDS).open("wb") as f:
        for rec in records:
            f.write(orjson.dumps(rec) + b"\n")
    (folder / CLOCK).write_bytes(orjson.dumps(dataclasses.asdict(clock)))
    setup = {
        "format": FORMAT,
        "shard": {"index": index, "count": count},
        "run_id": report.run_id,
        "config": report.config,
        "tokenizer": report.tokenizer,
        "overhead": report.overhead.model_dump() if report.overhead else None,
    }
    tmp = folder / (SETUP + ".tmp")
    tmp.write_bytes(orjson.dumps(setup, option=orjson.OPT_INDENT_2))
    os.replace(tmp, folder / SETUP)
    return folder


def _json(path: Path) -> Any:
    try:
        return orjson.loads(path.read_bytes())
    except orjson.JSONDecodeError:
        raise ValueError(f"{path}: not JSON") from None


def read_shard(folder: Path) -> Shard:
    """One shard's folder; ValueError naming the file for anything unreadable (OSError for a missing file)."""
    setup = _json(folder / SETUP)
    if not isinstance(setup, dict) or setup.get("format") != FORMAT:
        raise ValueError(f"{folder / SETUP}: not a shard setup of format {FORMAT}")
    clock = _json(folder / CLOCK)
    names = {f.name for f in dataclasses.fields(Record)}
    records = []
    with (folder / RECORDS).open("rb") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = orjson.loads(line)
                records.append(Record(**{k: v for k, v in obj.items() if k in names}))
            except (orjson.JSONDecodeError, TypeError, AttributeError):
                raise ValueError(f"{folder / RECORDS} line {n}: not a request record") from None
    try:
        return Shard(
            path=folder,
            index=int(setup["shard"]["index"]),
            count=int(setup["shard"]["count"]),
            run_id=str(setup["run_id"]),
            config=dict(setup["config"]),
            tokenizer=dict(setup["tokenizer"]),
            overhead=setup.get("overhead"),
            clock=Clock(wall_s=float(clock["wall_s"]), monotonic_s=float(clock["monotonic_s"])),
            records=records,
        )
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"{folder}: setup.json or clock.json lacks a field") from None
