"""An oracle subprocess that answers JSON lines: the vLLM oracle (tests/vllm_oracle/oracle_proc.py) and the
SGLang one (tests/sglang_server/sglang_proc.py) each run a server's own request preprocessing in its venv's
python, read one JSON request per stdin line and write one JSON answer per stdout line (the first: ready).

Started in a session of its own (a server's imports start children), stopped with its process group.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.vllm_server.vllm_proc import log_tail
from tests.vllm_server.vllm_proc import stop as stop_group


class OracleFailed(RuntimeError):
    """The oracle exited or stopped answering (a test failure, never a skip)."""


@dataclass
class OraclePipe:
    name: str  # "the vLLM oracle", in failures
    proc: subprocess.Popen[bytes]
    log_path: Path

    def read(self, deadline: float) -> dict[str, Any]:
        """The next answer line; OracleFailed (with the log's tail) if none comes by `deadline` (monotonic)."""
        assert self.proc.stdout is not None
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            if not sel.select(timeout=max(0.0, deadline - time.monotonic())):
                raise OracleFailed(f"{self.name} did not answer in time: {log_tail(self.log_path)}")
        line = self.proc.stdout.readline()
        if not line:
            raise OracleFailed(f"{self.name} exited with {self.proc.wait()}: {log_tail(self.log_path)}")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def ready(self, deadline: float) -> dict[str, Any]:
        """The first line, which says ready (and the server's version)."""
        first = self.read(deadline)
        if first.get("ready") is not True:
            raise OracleFailed(f"unexpected first line from {self.name}: {first}")
        return first

    def ask(self, request: Any, seconds: float) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(request).encode() + b"\n")
        self.proc.stdin.flush()
        return self.read(time.monotonic() + seconds)

    def stop(self) -> None:
        """By pid, with its process group."""
        for stream in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                if stream is not None:
                    stream.close()
        stop_group(self.proc)


def spawn_oracle(name: str, argv: list[str], log_path: Path, env: Mapping[str, str]) -> OraclePipe:
    """`argv` (a venv's python and its oracle script) with offline Hugging Face settings and the venv's own
    packages only (no PYTHONPATH); stderr to `log_path`."""
    child_env = {**os.environ, **env, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    child_env.pop("PYTHONPATH", None)
    with log_path.open("wb") as log:  # the child keeps its own handle
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            env=child_env,
            start_new_session=True,
        )
    return OraclePipe(name, proc, log_path)
