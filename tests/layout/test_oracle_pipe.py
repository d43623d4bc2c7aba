"""The JSON-line pipe the vLLM and SGLang oracles share (tests/oracle_pipe.py), on a stand-in oracle: a plain
python that says ready, answers one request, then exits."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from tests.oracle_pipe import OracleFailed, spawn_oracle

STAND_IN = """
import json, sys
print(json.dumps({"ready": True, "version": "0"}), flush=True)
request = json.loads(sys.stdin.readline())
print(json.dumps({"status": 200, "echo": request}), flush=True)
print("a last word on stderr", file=sys.stderr)
"""


def test_ready_answer_then_exit_is_a_failure_with_the_log(tmp_path: Path) -> None:
    pipe = spawn_oracle("the stand-in oracle", [sys.executable, "-c", STAND_IN], tmp_path / "o.log", {})
    try:
        assert pipe.ready(time.monotonic() + 60)["version"] == "0"
        assert pipe.ask({"n": 1}, 60) == {"status": 200, "echo": {"n": 1}}
        with pytest.raises(OracleFailed, match="the stand-in oracle exited with 0: a last word on stderr"):
            pipe.read(time.monotonic() + 60)
    finally:
        pipe.stop()
    assert pipe.proc.returncode == 0
