"""Arrival schedules: vLLM's gamma burstiness, linear ramps of rate and of users, trace time scaling.

Statistical checks use fixed seeds (deterministic) and large samples; the bounds come from the definition
(a gamma gap of shape b and scale 1/(rate*b) has mean 1/rate and squared coefficient of variation 1/b), not
from this code's output.
"""

from __future__ import annotations

import itertools
import statistics
from typing import Any

import pytest

from loadgen.config import LoadgenConfig
from loadgen.workload.arrivals import open_loop_offsets, scaled_trace, user_starts


def cfg(**kw: Any) -> LoadgenConfig:
    base: dict[str, Any] = {"url": "http://x", "isl": 64, "request_rate": 10.0, "duration": 5.0}
    return LoadgenConfig(**{**base, **kw})


def gaps(offsets: list[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise(offsets)]


@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
def test_gamma_gaps_have_the_rate_and_the_burstiness_of_vllms_definition(burstiness: float) -> None:
    c = cfg(arrival="gamma", burstiness=burstiness, request_rate=50.0, duration=400.0)
    g = gaps(open_loop_offsets(c, 0, 1, None))
    assert len(g) > 15_000
    mean = statistics.fmean(g)
    assert mean == pytest.approx(1 / 50, rel=0.05)
    cv2 = statistics.pvariance(g) / mean**2
    assert cv2 == pytest.approx(1 / burstiness, rel=0.12)


def test_gamma_run_of_n_requests_is_rescaled_to_end_at_n_over_rate() -> None:
    # vLLM rescales the cumulative delays so the run spans exactly N / rate (here the first send is at 0).
    offsets = open_loop_offsets(
        cfg(arrival="gamma", burstiness=0.3, request_count=200, duration=None), 0, 1, 200
    )
    assert offsets[0] == 0.0
    assert offsets[-1] == pytest.approx(199 / 10.0)
    assert all(b >= a for a, b in itertools.pairwise(offsets))


def test_poisson_is_not_rescaled() -> None:
    offsets = open_loop_offsets(cfg(request_count=200, duration=None), 0, 1, 200)
    assert offsets[-1] != pytest.approx(199 / 10.0, rel=1e-6)


def test_linear_ramp_of_rate_by_index_for_a_request_count() -> None:
    c = cfg(arrival="constant", request_rate=10.0, ramp_to=50.0, request_count=41, duration=None)
    g = gaps(open_loop_offsets(c, 0, 1, 41))
    # Request i is sent at rate 10 + 40 * i / 40 (vLLM's linear ramp-up): its gap to the next is 1 / that rate.
    assert g == pytest.approx([1 / (10 + i) for i in range(40)])


def test_linear_ramp_of_rate_over_a_duration() -> None:
    c = cfg(arrival="poisson", request_rate=20.0, ramp_to=200.0, duration=20.0)
    offsets = open_loop_offsets(c, 0, 1, None)
    assert offsets[-1] < 20.0
    # The expected count is the integral of the rate: (20 + 200) / 2 * 20 s = 2200.
    assert len(offsets) == pytest.approx(2200, rel=0.05)
    first = sum(1 for t in offsets if t < 2.0)
    last = sum(1 for t in offsets if t >= 18.0)
    assert first == pytest.approx(2 * (20 + 38) / 2, rel=0.25)  # rate 20 -> 38 over the first 2 s
    assert last == pytest.approx(2 * (182 + 200) / 2, rel=0.1)


def test_workers_split_the_rate_and_interleave_constant_slots() -> None:
    c = cfg(arrival="constant", request_rate=10.0, request_count=20, duration=None, workers=2)
    both = sorted(open_loop_offsets(c, 0, 2, 10) + open_loop_offsets(c, 1, 2, 10))
    assert gaps(both) == pytest.approx([0.1] * 19)


def test_users_join_one_at_a_time_over_the_duration() -> None:
    c = cfg(request_rate=None, concurrency=2, ramp_to=6, duration=10.0)
    starts = user_starts(c, 2, 6)
    assert starts == pytest.approx([0, 0, 2, 4, 6, 8])
    assert user_starts(cfg(request_rate=None, concurrency=3), 3, 3) == [0, 0, 0]


def test_trace_timestamps_are_milliseconds_from_the_first_scaled_by_the_speedup() -> None:
    assert scaled_trace([1000, 1500, 4000], 2.0) == pytest.approx([0.0, 0.25, 1.5])
    assert scaled_trace([], 1.0) == []


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"burstiness": 0.5}, "--burstiness needs --arrival gamma"),
        ({"request_rate": None, "concurrency": 2, "ramp_to": 4, "duration": None, "request_count": 5},
         "needs --duration"),
        ({"request_rate": None, "concurrency": 4, "ramp_to": 2}, "above --concurrency"),
        ({"ramp_to": 20, "sweep": [1, 2]}, "does not combine"),
    ],
)  # fmt: skip
def test_refused_load_shapes(kw: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        cfg(**kw)


async def test_a_concurrency_ramp_runs_exact_against_the_emulator() -> None:
    from loadgen.send.runner import Engine
    from loadgen.workload.conversations import Workload
    from proxy.emulator.app import EmulatorConfig, start_emulator
    from tests.conftest import load_builtin

    tok = load_builtin()
    runner, url = await start_emulator(EmulatorConfig(), tokenizer=tok)
    try:
        c = LoadgenConfig(url=url, isl=64, osl=2, concurrency=1, ramp_to=3, duration=0.3)
        recs = await Engine(c, Workload(tok.tokenizer, c)).run()
    finally:
        await runner.cleanup()
    assert recs and all(r.client_isl == r.target_isl == r.server_prompt_tokens == 64 for r in recs)
