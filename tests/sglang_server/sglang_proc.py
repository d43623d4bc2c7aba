"""SGLang's own chat preprocessing as a long-lived subprocess per family (sglang_oracle.py beside this, run
with the SGLang venv's python from scripts/install_sglang.sh): SGLang's imports take ~16 s, so each
oracle starts once per session and answers every shape over stdin/stdout, one JSON line each way.

Each family's model folder is the vLLM oracle's (tests/vllm_oracle/oracle_proc.py `model_folder`): a
config.json with the real `model_type` and architecture beside the shared tokenizer files. SGLang reads the
config (`TokenizerManager.init_model_config`: ModelConfig, which picks `is_gpt_oss` and the chat encoder
from it) and the tokenizer, never weights here.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from tests.vllm_server.vllm_proc import stop as stop_group
from tests.vllm_server.vllm_proc import venv_python

REPO = Path(__file__).resolve().parents[2]
INSTALL_SCRIPT = REPO / "scripts" / "install_sglang.sh"
ORACLE = Path(__file__).with_name("sglang_oracle.py")
ENV_PYTHON = "ISLWATCH_SGLANG_PYTHON"
# family (folder in ../shared/tokenizers) -> `sglang serve` flags as SGLang's docs give them for the model: its
# tool-call parser (so that tool_choice auto/required/named is accepted) and its reasoning parser, if any.
FAMILIES: dict[str, tuple[str, ...]] = {
    "qwen2.5-instruct": ("--tool-call-parser", "qwen"),
    "llama-3-8b-instruct": ("--tool-call-parser", "llama3"),
    "qwen3": ("--tool-call-parser", "qwen25", "--reasoning-parser", "qwen3"),
    "llama-3.1": ("--tool-call-parser", "llama3"),
    "gemma-3": ("--tool-call-parser", "pythonic"),
    "gpt-oss": ("--tool-call-parser", "gpt-oss", "--reasoning-parser", "gpt-oss"),
    "deepseek-r1": ("--tool-call-parser", "deepseekv3", "--reasoning-parser", "deepseek-r1"),
}
# A second server for these families, started with `--default-chat-template-kwargs` as well (the test of
# islwatch's `default_chat_template_kwargs` setting under the sglang flavor): family -> those kwargs.
DEFAULT_KWARGS: dict[str, dict[str, Any]] = {
    "qwen3": {"enable_thinking": False},
    "gpt-oss": {"reasoning_effort": "xhigh"},  # a token more than "low" or "high" in the system message
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
    default_kwargs: dict[str, Any] = field(default_factory=dict)  # its --default-chat-template-kwargs
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


@dataclass(frozen=True)
class Oracles:
    """Every oracle of the session, by family: started with FAMILIES' flags, and with DEFAULT_KWARGS too."""

    plain: dict[str, Oracle]
    default_kwargs: dict[str, Oracle]


def launch(
    python: str, family: str, model_dir: Path, log_path: Path, default_kwargs: dict[str, Any] | None = None
) -> Oracle:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    env.pop("PYTHONPATH", None)  # the venv's own packages only
    flags = list(FAMILIES[family])
    if default_kwargs:
        flags += ["--default-chat-template-kwargs", json.dumps(default_kwargs)]
    log = open(log_path, "wb")  # noqa: SIM115 - the child owns the handle for its lifetime
    proc = subprocess.Popen(
        [python, str(ORACLE), str(model_dir), *flags],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=log,
        env=env,
        start_new_session=True,
    )
    return Oracle(family, model_dir, proc, log_path, dict(default_kwargs or {}))


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
