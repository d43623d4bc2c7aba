"""`islwatch demo` end to end in a subprocess: every scene runs to its verdict, the summary says what the
proxy's /metrics said, and Ctrl-C leaves no process behind."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import orjson
import pytest

from tests.conftest import REPO
from tests.eventually import eventually
from tests.lanes import sweep
from tests.loadgen.demolib import (
    DEMO,
    TIMEOUT_S,
    alive,
    descendants,
    interruptible,
    read_lines,
    summary,
    wait_serving,
)

BOTH = "IslwatchDuplicateBOS, IslwatchTokenDrift"


@pytest.mark.slow  # every scene, a process each
def test_demo_runs_every_scene_to_the_end(tmp_path: Path) -> None:
    out = subprocess.run(
        [*DEMO, "--requests", "6", "--output", str(tmp_path / "r.json")],
        cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT_S,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "/metrics" in out.stdout
    assert "proxy's own match" in out.stdout  # the correct scene shows the loadgen's full report
    report = orjson.loads((tmp_path / "r-correct.json").read_bytes())
    assert report["requests"] == 6 and report["isl"]["server_exact"] == 6
    assert report["proxy"]["islwatch_isl_match_total"] == {"exact": 6.0}
    # The loadgen's reports carry the proxy's own counts (its /metrics) for the drift scenes too.
    for scene, cause in (("double-bos", "duplicate_bos"), ("template-swap", "hidden_system_prompt")):
        proxy = orjson.loads((tmp_path / f"r-{scene}.json").read_bytes())["proxy"]
        assert proxy["islwatch_isl_match_total"] == {"mismatch": 6.0}, scene
        assert proxy["islwatch_drift_total"] == {cause: 6.0}, scene
    assert summary(out.stdout) == {
        "correct": ["6", "6/6", "0", "exact", "-"],
        "double-bos": ["6", "0/6", "+1", "duplicate_bos", BOTH],
        # "You are a helpful assistant.\n\n" is 8 Mistral v0.1 tokens in front of the first user turn.
        "template-swap": ["6", "0/6", "+8", "hidden_system_prompt", "IslwatchTokenDrift"],
    }
    verdicts = [line for line in out.stdout.splitlines() if line.startswith("verdict: ")]
    assert verdicts == [
        "verdict: OK: 6/6 requests exact (templated == server); no alert would fire",
        f"verdict: DRIFT +1 token on 6/6 requests, cause duplicate_bos (a second BOS); would fire: {BOTH}",
        "verdict: DRIFT +8 tokens on 6/6 requests, cause hidden_system_prompt (text the client never sent); "
        "would fire: IslwatchTokenDrift",
    ]
    # The parity gate: the extra-special path duplicates BOS; the swapped template differs at position 4.
    assert "PASS (split == direct on 3 conversations, 1 skipped" in out.stdout
    assert (
        "FAIL at position 1 of conversation 0: 15 intended tokens, 16 sent, ids start [1, 1] ('<s>', '<s>')"
        in out.stdout
    )
    assert "FAIL at position 4 of conversation 0: 1824 '▁What' -> 995 '▁You' (15 -> 23 tokens)" in out.stdout


@pytest.mark.parametrize(
    ("group", "scenes"),
    # the fast lane runs the demo's one-scene run (its only process start there); all scenes: the whole suite
    sweep(
        [(True, []), (False, ["--scene", "correct"])],
        ids=["ctrl-c-group-all-scenes", "sigint-demo-only-one-scene"],
        fast=1,
        unpack=True,
    ),
)
def test_ctrl_c_leaves_no_orphans(group: bool, scenes: list[str]) -> None:
    proc = subprocess.Popen(
        [*DEMO, "--requests", "4", "--keep-running", *scenes],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        preexec_fn=interruptible,
    )  # fmt: skip
    lines = read_lines(proc)
    try:
        wait_serving(proc, lines)
        kids = descendants(proc.pid)
        assert len(kids) >= 2  # the last scene's emulator and proxy (and the proxy's analysis worker)
        if group:
            os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole foreground group
        else:
            proc.send_signal(signal.SIGINT)  # only the demo: it must stop its children itself
        # Wait on the events themselves: the demo exiting, then each child. The bounds only end a test
        # that hangs; a busy machine (each child stops gracefully, up to 15 s before a kill) takes longer.
        proc.wait(timeout=TIMEOUT_S)
        eventually(lambda: [k for k in kids if alive(k)], until=lambda left: not left, timeout=TIMEOUT_S,
                   what="every child of the demo exiting")  # fmt: skip
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
