"""When requests are sent: the open loop's arrival schedule and the closed loop's user start times. Pure.

Open loop (`--request-rate R`), `--arrival`:
- `poisson`: exponential gaps at R (a Poisson process).
- `constant`: evenly spaced, each offset computed from its index (no float error piles up into an extra slot).
- `gamma`: vLLM's burstiness (vllm/benchmarks/serve.py, `get_request`, vLLM 0.32): gaps are drawn from
  Gamma(shape=b, scale=1/(R*b)), whose mean is 1/R for every b; b = 1 is a Poisson process, b < 1 burstier,
  b > 1 more even (`--burstiness b`, default 1). As vLLM does without a ramp, a run of N requests is then
  rescaled so its last arrival lands where N/R puts it ("to stabilize the throughput data from different
  random seeds").
- `--ramp-to R1`: the rate moves linearly from R to R1 (vLLM's `--ramp-up-strategy linear`): request i of N
  is sent at rate R + (R1 - R) * i / (N - 1); with `--duration D` the rate at time t is R + (R1 - R) * t / D.
  Each gap is drawn at the current rate with the arrival kind's law.

Closed loop with `--ramp-to N1` (and `--duration D`): the run starts with `--concurrency N0` users and adds
one user at a time at evenly spaced times, the last joining at D * s / (s + 1) for s = N1 - N0 added users.

With `--workers W`, each worker sends 1/W of the rate (a constant schedule shifted by its index) and of the
requests and users.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence

from loadgen.config import LoadgenConfig


def _gap(rng: random.Random, kind: str, rate: float, burstiness: float) -> float:
    if kind == "poisson":
        return rng.expovariate(rate)
    if kind == "gamma":
        # random.gammavariate(alpha, beta) has mean alpha * beta: shape b, scale 1 / (rate * b) as in vLLM.
        return rng.gammavariate(burstiness, 1.0 / (rate * burstiness))
    return 1.0 / rate


def arrivals(
    rate: float, kind: str, seed: str, phase: float = 0.0, burstiness: float = 1.0
) -> Iterator[float]:
    """Send offsets in seconds from the start at a fixed rate, without end."""
    rng = random.Random(seed)
    t = phase
    i = 0
    while True:
        yield t
        i += 1
        t = phase + i / rate if kind == "constant" else t + _gap(rng, kind, rate, burstiness)


def _ramped(cfg: LoadgenConfig, rate0: float, rate1: float, count: int | None, seed: str) -> list[float]:
    rng = random.Random(seed)
    out: list[float] = []
    t = 0.0
    duration = cfg.duration or 0.0
    while True:
        i = len(out)
        if count is not None:
            if i >= count:
                return out
            progress = i / max(count - 1, 1)
        else:
            if t >= duration:
                return out
            progress = t / duration
        out.append(t)
        t += _gap(rng, cfg.arrival, rate0 + (rate1 - rate0) * progress, cfg.burstiness)


def open_loop_offsets(cfg: LoadgenConfig, worker: int, workers: int, count: int | None) -> list[float]:
    """This worker's send offsets: `count` of them, or all before `cfg.duration` when count is None."""
    assert cfg.request_rate is not None
    rate = cfg.request_rate / workers
    seed = f"{cfg.seed}/arrivals/{worker}"
    if cfg.ramp_to is not None:
        return _ramped(cfg, rate, cfg.ramp_to / workers, count, seed)
    phase = worker / (rate * workers) if cfg.arrival == "constant" else 0.0
    gen = arrivals(rate, cfg.arrival, seed, phase, cfg.burstiness)
    if count is not None:
        out = [next(gen) for _ in range(count)]
        if cfg.arrival == "gamma" and count > 1 and out[-1] > phase:
            scale = ((count - 1) / rate) / (out[-1] - phase)
            out = [phase + (t - phase) * scale for t in out]
        return out
    out = []
    for t in gen:
        if t >= (cfg.duration or 0):
            return out
        out.append(t)
    return out


def user_starts(cfg: LoadgenConfig, first: int, last: int) -> list[float]:
    """Start offsets of a closed loop's users: `first` at once, then one at a time up to `last` users."""
    added = max(last - first, 0)
    if cfg.ramp_to is None or not added:
        return [0.0] * first
    step = (cfg.duration or 0.0) / (added + 1)
    return [0.0] * first + [step * (k + 1) for k in range(added)]


def scaled_trace(offsets_ms: Sequence[float], speedup: float) -> list[float]:
    """A trace's timestamps (milliseconds since its first request) as send offsets in seconds."""
    if not offsets_ms:
        return []
    t0 = min(offsets_ms)
    return [(t - t0) / 1000.0 / speedup for t in offsets_ms]
