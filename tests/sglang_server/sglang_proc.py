"""SGLang's own chat preprocessing as a long-lived subprocess per family (sglang_oracle.py beside this, run
with the SGLang venv's python from scripts/install_sglang.sh): SGLang's imports take ~16 s, so each
oracle starts once per session and answers every shape over stdin/stdout, one JSON line each way.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from vllm_server.vllm_proc import stop as stop_group
from vllm_server.vllm_proc import venv_python

REPO = Path(__file__).resolve().parents[2]
INSTALL_SCRIPT = REPO / "scripts" / "install_sglang.sh"
ORACLE = Path(__file__).with_name("sglang_oracle.py")
ENV_PYTHON = "ISLWATCH_SGLANG_PYTHON"
# family (folder in ../shared/tokenizers) -> (tiny model architecture, SGLang's tool-call parser for it)
FAMILIES = {
    "qwen2.5-instruct": ("qwen2", "qwen"),
    "llama-3-8b-instruct": ("llama", "llama3"),
}
# Guards against a hung child, not timing assertions: the imports take ~16 s on 2 idle cores.
READY_DEADLINE_SECONDS = 300.0
ANSWER_DEADLINE_SECONDS = 120.0


class SglangUnavailable(RuntimeError):
    """SGLang is not installed and the install script could not install it (the only reason to skip)."""


class OracleFailed(RuntimeError):
    """The oracle exited or stopped answering (a test failure, never a skip)."""


def find_python() -> str:
    return venv_python(INSTALL_SCRIPT, ENV_PYTHON, SglangUnavailable, "SGLang")


def _read_line(stream: BinaryIO, proc: subprocess.Popen[bytes], deadline: float, log: Path) -> dict[str, Any]:
    with selectors.DefaultSelector() as sel:
        sel.register(stream, selectors.EVENT_READ)
        if not sel.select(timeout=max(0.0, deadline - time.monotonic())):
            raise OracleFailed(f"the SGLang oracle did not answer in time: {log_tail(log)}")
    line = stream.readline()
    if not line:
        raise OracleFailed(f"the SGLang oracle exited with {proc.wait()}: {log_tail(log)}")
    answer: dict[str, Any] = json.loads(line)
    return answer


@dataclass
class Oracle:
    family: str
    model_dir: Path
    proc: subprocess.Popen[bytes]
    log_path: Path
    version: str = ""

    def wait_ready(self) -> None:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + READY_DEADLINE_SECONDS
        ready = _read_line(self.proc.stdout, self.proc, deadline, self.log_path)
        if ready.get("ready") is not True:
            raise OracleFailed(f"unexpected first line from the SGLang oracle: {ready}")
        self.version = str(ready["version"])

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        """{"status": 200, "input_ids": [...]} or {"status": 400 | 500, "error": ...}, as SGLang answers."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(body).encode() + b"\n")
        self.proc.stdin.flush()
        deadline = time.monotonic() + ANSWER_DEADLINE_SECONDS
        return _read_line(self.proc.stdout, self.proc, deadline, self.log_path)


def launch(python: str, family: str, model_dir: Path, log_path: Path) -> Oracle:
    parser = FAMILIES[family][1]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    env.pop("PYTHONPATH", None)  # the venv's own packages only
    log = open(log_path, "wb")  # noqa: SIM115 - the child owns the handle for its lifetime
    proc = subprocess.Popen(
        [python, str(ORACLE), str(model_dir), "--tool-call-parser", parser],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=log,
        env=env,
        start_new_session=True,
    )
    return Oracle(family, model_dir, proc, log_path)


def stop(oracle: Oracle) -> None:
    """By pid, with its process group (its interpreter's shutdown after SGLang's imports is slow)."""
    proc = oracle.proc
    for stream in (proc.stdin, proc.stdout):
        with contextlib.suppress(OSError):
            if stream is not None:
                stream.close()
    stop_group(proc)


def log_tail(log_path: Path, lines: int = 8) -> str:
    try:
        return " | ".join(log_path.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return "(no log)"
