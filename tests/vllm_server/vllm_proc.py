"""Installing, starting and stopping real vLLM OpenAI servers (the CPU build) for the vLLM tests.

Plain functions (subprocess + urllib). The venv comes from scripts/install_vllm.sh (cached, keyed by
version); the tiny models from scripts/build_tiny_model.py, run in that venv and cached next to it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
INSTALL_SCRIPT = REPO / "scripts" / "install_vllm.sh"
BUILD_MODEL = REPO / "scripts" / "build_tiny_model.py"
ENV_PYTHON = "ISLWATCH_VLLM_PYTHON"
TOOLS = ("--enable-auto-tool-choice", "--tool-call-parser")
# family (a folder of the built test tokenizers) -> (architecture, `vllm serve` flags): the tool-call parser a
# deployment passes so that `tools` are accepted, and the reasoning parser where the model has one; the flags
# the family's in-process oracle is built with (tests/vllm_oracle/oracle_proc.py). Llama 3.1's vocabulary has
# <|python_tag|>, which `llama3_json` needs (Llama 3.0's lacks it: that parser refuses to start there).
# Three servers in all with the embedding one (~3.9 GB and a minute of start-up each): a live server proves
# what the in-process oracle (tests/vllm_oracle) cannot, that the oracle is the server, and two families with
# and without a reasoning parser prove it (test_vllm_oracle_shapes.py). The older families are the oracle's:
# Llama 3.0 agreed with its live server, when it was served, on all 48 shapes both saw, and Qwen2.5 on all
# 100 (it is still served for embeddings, EMBED_FAMILY).
FAMILIES: dict[str, tuple[str, tuple[str, ...]]] = {
    "qwen3": ("qwen3", (*TOOLS, "hermes", "--reasoning-parser", "qwen3")),
    "llama-3.1": ("llama", (*TOOLS, "llama3_json")),
}
# Each served family's architecture: the chat families', and Qwen2.5's, served for embeddings only
# (conftest.py EMBED_FAMILY).
ARCHITECTURES: dict[str, str] = {
    **{f: arch for f, (arch, _) in FAMILIES.items()},
    "qwen2.5-instruct": "qwen2",
}
# The server parity probe's differing server (test_vllm_probe.py): the Llama 3.1 server behind a proxy given
# another family's tokenizer, DeepSeek-V3's, which tokenizes the probe texts otherwise.
PROBE_SERVER = "llama-3.1"
PROBE_TOKENIZER = "deepseek-v3"
# The chat server whose whole bill is checked (usage details, /metrics counters, the prefix cache).
BILLED_FAMILY = "llama-3.1"
BILLED_BLOCK = 32
# A guard against a hung server, not a timing assertion: vLLM's imports take 70-105 s on 2 cores.
START_DEADLINE_SECONDS = 600.0


class VllmUnavailable(RuntimeError):
    """vLLM is not installed and the install script could not install it (the only reason to skip)."""


class ServerFailed(RuntimeError):
    """A vLLM server exited or never became healthy (a test failure, never a skip)."""


@dataclass(frozen=True)
class VllmServer:
    family: str
    model_dir: Path
    port: int
    log_path: Path
    version: str
    embedding: bool = False

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def model(self) -> str:
        return str(self.model_dir)


def installed(
    script: Path,
    env_var: str,
    usable: Callable[[str], bool],
    fails: Callable[[str], Exception],
    env: dict[str, str] | None = None,
) -> str:
    """$`env_var`, else the last line `script` prints (install scripts reuse their cache at once) when it is
    `usable`; otherwise raises `fails(the last lines of its stderr)`. For every server venv the tests use."""
    if os.environ.get(env_var):
        return os.environ[env_var]
    proc = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, check=False)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines or not usable(lines[-1]):
        raise fails(" | ".join(proc.stderr.strip().splitlines()[-3:]))
    return lines[-1]


def venv_python(script: Path, env_var: str, unavailable: type[Exception], name: str) -> str:
    """A server venv's python: $`env_var`, else what its install script prints."""
    return installed(
        script,
        env_var,
        lambda path: os.access(path, os.X_OK),
        lambda tail: unavailable(f"{name} is not installed and {script.name} failed: {tail}"),
    )


def find_python() -> str:
    return venv_python(INSTALL_SCRIPT, ENV_PYTHON, VllmUnavailable, "vLLM")


def vllm_version(python: str) -> str:
    out = subprocess.run(
        [python, "-c", "import vllm; print(vllm.__version__)"], capture_output=True, text=True
    )
    return out.stdout.strip() or "unknown"


def tiny_model(python: str, tokenizer_dir: Path, family: str) -> Path:
    """The tiny model for a family, built once (keyed by the tokenizer files' content)."""
    arch = ARCHITECTURES[family]
    digest = hashlib.sha256()
    for f in sorted(tokenizer_dir.iterdir()):
        digest.update(f.name.encode() + b"\0" + f.read_bytes())
    out = Path(python).parents[1] / "tiny-models" / f"{family}-{digest.hexdigest()[:12]}"  # the venv
    subprocess.run([python, str(BUILD_MODEL), str(tokenizer_dir), str(out), arch], check=True)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch(python: str, server: VllmServer) -> subprocess.Popen[bytes]:
    cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", server.model]
    cmd += ["--host", "127.0.0.1", "--port", str(server.port), "--enforce-eager", "--dtype", "float32"]
    cmd += ["--max-model-len", "4096"]
    if server.family == BILLED_FAMILY and not server.embedding:
        # The server the bill tests read (test_vllm_bill.py): its /metrics counters need the stats loggers
        # (`--disable-log-stats` removes them: vllm/v1/engine/async_llm.py), its usage the cached tokens, and
        # its prefix cache 32-token blocks (the CPU default is 128; CPU_ATTN needs a multiple of 32).
        cmd += ["--enable-prompt-tokens-details", "--enable-prefix-caching"]
        cmd += ["--block-size", str(BILLED_BLOCK)]
    else:
        cmd += ["--disable-log-stats"]
    if server.embedding:
        cmd += ["--convert", "embed"]
    else:
        cmd += FAMILIES[server.family][1]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    env.pop("PYTHONPATH", None)  # the venv's own packages only
    log = open(server.log_path, "wb")  # noqa: SIM115 - the child owns the handle for its lifetime
    return subprocess.Popen(
        cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True
    )


def healthy(base_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base_url}/health", timeout=5) as resp:
            return resp.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


def wait_healthy(proc: subprocess.Popen[bytes], server: VllmServer) -> None:
    deadline = time.monotonic() + START_DEADLINE_SECONDS
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ServerFailed(f"vLLM exited with {proc.returncode}: {log_tail(server.log_path)}")
        if healthy(server.base_url):
            return
        time.sleep(0.5)
    raise ServerFailed(f"vLLM not healthy after {START_DEADLINE_SECONDS}s: {log_tail(server.log_path)}")


def stop(proc: subprocess.Popen[bytes]) -> None:
    """By pid, with its process group (vLLM starts an engine core child)."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, 15)
            proc.wait(timeout=30)
        except (subprocess.TimeoutExpired, ProcessLookupError):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 9)
            proc.wait()


def log_tail(log_path: Path, lines: int = 8) -> str:
    try:
        return " | ".join(log_path.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return "(no log)"


def post(base_url: str, path: str, body: dict[str, object]) -> tuple[int, dict[str, object]]:
    req = urllib.request.Request(
        base_url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=300) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


def post_raw(base_url: str, path: str, body: dict[str, object]) -> tuple[int, bytes]:
    """The answer's status and bytes as they came (for streams and byte-for-byte comparisons)."""
    req = urllib.request.Request(
        base_url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=300) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()
