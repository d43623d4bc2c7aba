"""`--csv FILE`: one row per request, the --records fields as columns (a sweep adds the point's value first)."""

from __future__ import annotations

import csv
import dataclasses
from collections.abc import Iterable
from pathlib import Path

from loadgen.send.replies import Record


def columns(sweep: bool) -> list[str]:
    names = [f.name for f in dataclasses.fields(Record)]
    return ["point", *names] if sweep else names


def write_csv(path: Path, rows: Iterable[tuple[float | None, Record]], sweep: bool = False) -> int:
    """Write the rows (point value or None, record); returns how many were written. Empty cells are None."""
    n = 0
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(columns(sweep))
        for point, r in rows:
            values = ["" if v is None else v for v in dataclasses.astuple(r)]
            w.writerow([point, *values] if sweep else values)
            n += 1
    return n
