"""Each scene of `islwatch demo`, kept running: the test reads the proxy's /metrics itself and finds the
counts and the cause the demo's verdict names."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import orjson
import pytest

from tests.conftest import REPO
from tests.loadgen.demolib import DEMO, interruptible, metrics_url, read_lines, scrape, summary, wait_serving

REQUESTS = 5
LABELS = frozenset({("model", "default"), ("endpoint", "chat")})


@pytest.mark.slow  # a demo process per scene; tests/loadgen/test_demo.py keeps one scene run in the fast lane
@pytest.mark.parametrize(
    ("scene", "match", "cause", "drift", "alert"),
    [
        ("correct", "exact", "exact", 0, "-"),
        ("double-bos", "mismatch", "duplicate_bos", 1, "IslwatchDuplicateBOS, IslwatchTokenDrift"),
        ("template-swap", "mismatch", "hidden_system_prompt", 8, "IslwatchTokenDrift"),
    ],
)
def test_scene_counts_and_cause_on_the_proxys_metrics(
    tmp_path: Path, scene: str, match: str, cause: str, drift: int, alert: str
) -> None:
    output = tmp_path / "r.json"
    proc = subprocess.Popen(
        [*DEMO, "--scene", scene, "--requests", str(REQUESTS), "--keep-running", "--output", str(output)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        preexec_fn=interruptible,
    )  # fmt: skip
    lines = read_lines(proc)
    try:
        text = wait_serving(proc, lines)
        m = scrape(metrics_url(text))
        assert m[("islwatch_requests_total", LABELS | {("status_class", "2xx")})] == REQUESTS
        assert m[("islwatch_isl_match_total", LABELS | {("result", match)})] == REQUESTS
        assert m[("islwatch_drift_total", LABELS | {("cause", cause)})] == REQUESTS
        causes = {dict(k[1])["cause"]: v for k, v in m.items() if k[0] == "islwatch_drift_total" and v}
        assert causes == {cause: REQUESTS}
        bucket = "islwatch_isl_drift_tokens_bucket"
        assert m[(bucket, LABELS | {("le", f"{drift:.1f}")})] == REQUESTS  # every request drifted by `drift`
        assert m[(bucket, LABELS | {("le", f"{drift - 1:.1f}")})] == 0
        sign = f"{drift:+d}" if drift else "0"
        assert summary(text) == {scene: [str(REQUESTS), "5/5" if drift == 0 else "0/5", sign, cause, alert]}
        assert orjson.loads(output.read_bytes())["requests"] == REQUESTS  # one scene: the file as named
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 130
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
