"""How `--shard I/N` splits one run over N clients. Pure.

A run is sent by `senders` = N x `--workers` processes, numbered 0 .. senders - 1; shard I runs senders
I*W .. I*W + W - 1. Sender s of S (loadgen/send/runner.py) takes:
- conversations s, s + S, s + 2S, ... (ids `c<n>`: a dataset or trace record is chosen by n), so every id is
  the one a single client would give it;
- its share of `--request-count`, `--warmup` and `--concurrency`: total // S, one more for s < total % S;
- of the open loop, 1/S of the rate on its own seeded schedule (a constant schedule shifted by s / rate),
  or of a trace, the records s, s + S, ... at their own times.

So N shards of W workers send exactly what one client with `--workers N*W` sends, and the same requests (ids,
prompts, targets) as one client with any `--workers` when the request count settles the run.
"""

from __future__ import annotations

import re

SHARD = re.compile(r"^([0-9]+)/([1-9][0-9]*)$")


def parse_shard(text: str) -> tuple[int, int]:
    """`I/N` as (I, N); ValueError unless 0 <= I < N."""
    m = SHARD.match(text.strip())
    if not m:
        raise ValueError(f"--shard {text!r}: give I/N, e.g. 0/4")
    index, count = int(m.group(1)), int(m.group(2))
    if index >= count:
        raise ValueError(f"--shard {text}: the index counts from 0 to {count - 1}")
    return index, count


def share(total: int, sender: int, senders: int) -> int:
    """Sender `sender`'s part of `total` (requests, users): the parts of all senders add up to `total`."""
    return total // senders + (1 if sender < total % senders else 0)


def shard_senders(index: int, count: int, workers: int) -> range:
    """The run-wide sender numbers shard `index` of `count` runs, each shard running `workers` processes."""
    return range(index * workers, (index + 1) * workers)


def shard_share(total: int, index: int, count: int, workers: int) -> int:
    """Shard `index`'s part of `total`: its senders' parts."""
    return sum(share(total, s, count * workers) for s in shard_senders(index, count, workers))
