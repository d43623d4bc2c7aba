"""`islwatch loadgen merge DIR...`: one report from the records of a run's shards.

The report is built from every shard's records together, by the function that builds a single run's
(loadgen/report/model.py): percentiles are taken over all the requests, never averaged per shard. Shards
of different setups, a shard index given twice or one missing are refused (exit 2).
"""

from __future__ import annotations

import dataclasses
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from loadgen.config import LoadgenConfig
from loadgen.report.goodput import goodput
from loadgen.report.model import LoadgenReport, Overheads, build_report
from loadgen.report.outputs import print_goodput, write_outputs
from loadgen.report.shard_dir import SETUP, Shard, read_shard
from loadgen.report.table import print_report
from loadgen.send.replies import Record

# Config keys that name where one shard writes or which shard it is: they may differ between shards.
PER_SHARD = frozenset({"shard", "output", "records", "html", "csv", "run_dir", "proxy_metrics_url"})


class MergeError(ValueError):
    """Shards that do not make one run."""


def shard_folders(paths: Sequence[Path]) -> list[Path]:
    """Each path is a shard's folder (it holds setup.json) or a --run-dir holding shard folders."""
    out: list[Path] = []
    for p in paths:
        if (p / SETUP).is_file():
            out.append(p)
            continue
        found = sorted(c for c in p.iterdir() if (c / SETUP).is_file()) if p.is_dir() else []
        if not found:
            raise MergeError(f"{p}: no finished shard here (no {SETUP} in it or in a folder in it)")
        out += found
    return out


def _setup(s: Shard) -> dict[str, Any]:
    return {
        "run_id": s.run_id,
        "tokenizer": s.tokenizer,
        **{k: v for k, v in s.config.items() if k not in PER_SHARD},
    }


def check_shards(shards: Sequence[Shard]) -> None:
    """MergeError unless the shards are indices 0..N-1 of one N-way split of one setup, each once."""
    first = shards[0]
    for s in shards[1:]:
        if s.count != first.count:
            raise MergeError(f"{s.path} is a shard of {s.count}, {first.path} of {first.count}")
        a, b = _setup(first), _setup(s)
        differ = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
        if differ:
            raise MergeError(
                f"{s.path} and {first.path} are shards of different setups (they differ in {', '.join(differ)})"
            )
    seen = Counter(s.index for s in shards)
    twice = sorted(i for i, n in seen.items() if n > 1)
    if twice:
        where = ", ".join(str(s.path) for s in shards if s.index in twice)
        raise MergeError(
            f"shard(s) {', '.join(map(str, twice))} of {first.count} given more than once: {where}"
        )
    missing = sorted(set(range(first.count)) - set(seen))
    if missing:
        raise MergeError(f"shard(s) {', '.join(map(str, missing))} of {first.count} missing")


def merged_records(shards: Sequence[Shard]) -> list[Record]:
    """Every shard's records in shard order, their times moved onto the clock of the lowest shard: each
    machine's monotonic time plus its wall-minus-monotonic offset, minus the reference's offset."""
    ordered = sorted(shards, key=lambda s: s.index)
    ref = ordered[0].clock.offset_s
    out = []
    for s in ordered:
        shift = s.clock.offset_s - ref
        for r in s.records:
            scheduled = None if r.scheduled_at is None else r.scheduled_at + shift
            out.append(dataclasses.replace(r, sent_at=r.sent_at + shift, scheduled_at=scheduled))
    return out


def merge(shards: Sequence[Shard]) -> tuple[LoadgenConfig, list[Record], LoadgenReport]:
    """The run's config (its shard unset), all records and the one report. MergeError for bad shards."""
    if not shards:
        raise MergeError("no shards to merge")
    check_shards(shards)
    first = min(shards, key=lambda s: s.index)
    # The shard validated this config when it ran; it is only read here (its SLO), never sent again.
    config = {**first.config, **dict.fromkeys(PER_SHARD), "shards": first.count}
    cfg = LoadgenConfig.model_construct(
        **{k: v for k, v in config.items() if k in LoadgenConfig.model_fields}
    )
    records = merged_records(shards)
    report = build_report(
        records,
        run_id=first.run_id,
        config=config,
        tokenizer=first.tokenizer,
        overhead=Overheads(**first.overhead) if first.overhead else None,
    )
    if cfg.slo:
        report = report.model_copy(update={"goodput": goodput(records, cfg.slo, report.duration_s)})
    return cfg, records, report


def run_merge(dirs: Sequence[Path], outputs: dict[str, Path | None], console: Console) -> int:
    """Read, check and merge the shards; print the tables; write the asked outputs. Exit 2 on bad shards."""
    try:
        shards = [read_shard(p) for p in shard_folders(dirs)]
        cfg, records, report = merge(shards)
    except (ValueError, OSError) as exc:  # MergeError is a ValueError
        print(f"islwatch loadgen merge: {exc}", file=sys.stderr)
        return 2
    console.print(f"merged {len(shards)} shard(s) of run {report.run_id}: {len(records)} records")
    print_report(console, report)
    print_goodput(console, report, cfg.slo_attainment)
    write_outputs(cfg.model_copy(update=outputs), [(None, records, report)])
    return 0 if report.succeeded or not report.requests else 1
