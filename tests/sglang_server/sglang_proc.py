"""SGLang's own chat preprocessing as a long-lived subprocess per family (sglang_oracle.py beside this, run
with the SGLang venv's python from scripts/install_sglang.sh): SGLang's imports take ~16 s, so each
oracle starts once per session and answers every shape over stdin/stdout, one JSON line each way.

Each family's model folder is the vLLM oracle's (tests/vllm_oracle/oracle_proc.py `model_folder`): a
config.json with the real `model_type` and architecture beside the shared tokenizer files. SGLang reads the
config (`TokenizerManager.init_model_config`: ModelConfig, which picks `is_gpt_oss` and the chat encoder
from it) and the tokenizer, never weights here.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.oracle_pipe import OraclePipe, spawn_oracle
from tests.vllm_server.vllm_proc import venv_python

REPO = Path(__file__).resolve().parents[2]
INSTALL_SCRIPT = REPO / "scripts" / "install_sglang.sh"
ORACLE = Path(__file__).with_name("sglang_oracle.py")
ENV_PYTHON = "ISLWATCH_SGLANG_PYTHON"
# family (a folder of the built test tokenizers) -> `sglang serve` flags as SGLang's docs give them for the model: its
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


def find_python() -> str:
    return venv_python(INSTALL_SCRIPT, ENV_PYTHON, SglangUnavailable, "SGLang")


@dataclass
class Oracle:
    family: str
    model_dir: Path
    pipe: OraclePipe
    default_kwargs: dict[str, Any] = field(default_factory=dict)  # its --default-chat-template-kwargs
    version: str = ""

    def wait_ready(self) -> None:
        ready = self.pipe.ready(time.monotonic() + READY_DEADLINE_SECONDS)
        self.version = str(ready["version"])

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        """{"status": 200, "input_ids": [...]} or {"status": 400 | 500, "error": ...}, as SGLang answers."""
        return self.pipe.ask(body, ANSWER_DEADLINE_SECONDS)


@dataclass(frozen=True)
class Oracles:
    """Every oracle of the session, by family: started with FAMILIES' flags, and with DEFAULT_KWARGS too."""

    plain: dict[str, Oracle]
    default_kwargs: dict[str, Oracle]


def launch(
    python: str, family: str, model_dir: Path, log_path: Path, default_kwargs: dict[str, Any] | None = None
) -> Oracle:
    flags = list(FAMILIES[family])
    if default_kwargs:
        flags += ["--default-chat-template-kwargs", json.dumps(default_kwargs)]
    pipe = spawn_oracle("the SGLang oracle", [python, str(ORACLE), str(model_dir), *flags], log_path, {})
    return Oracle(family, model_dir, pipe, dict(default_kwargs or {}))


def stop(oracle: Oracle) -> None:
    """By pid, with its process group (its interpreter's shutdown after SGLang's imports is slow)."""
    oracle.pipe.stop()
