"""Finding, starting and stopping a real llama.cpp `llama-server` for the interop tests.

Plain functions (subprocess + urllib), so scripts/start_llama_server.sh-style use and the session fixtures
share one way of starting the server: loopback only, one slot, one thread, no web UI, a free port.
"""

from __future__ import annotations

import json
import os
import subprocess
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from proxy.runtime.children import free_port  # noqa: F401 - re-exported to the interop tests
from tests.eventually import eventually

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "scripts" / "build_llama_server.sh"
GGUF_SCRIPT = REPO / "scripts" / "build_tiny_gguf.sh"
ENV_BINARY = "ISLWATCH_LLAMA_SERVER"
# family (a folder of the built test tokenizers) -> architecture of the tiny random-weight GGUF that
# scripts/build_tiny_gguf.sh builds around it with llama.cpp's own convert_hf_to_gguf.py (cached, keyed by the
# tokenizer's content). The two older families (`family` in tests/interop) and the two modern ones
# (`modern_family`).
GGUF = {"qwen2.5-instruct": "qwen2", "llama-3-8b-instruct": "llama"}
BUILT_GGUF = {"qwen3": "qwen3", "gpt-oss": "gpt_oss"}
# A guard against a hung server, not a timing assertion: loading a tiny model takes about a second.
START_DEADLINE_SECONDS = 120.0


class BinaryUnavailable(RuntimeError):
    """llama-server (or a tiny GGUF) is absent and its build script could not produce it (the only reason
    to skip)."""


class ServerFailed(RuntimeError):
    """llama-server exited or never became healthy (a test failure, never a skip)."""


@dataclass(frozen=True)
class LlamaServer:
    family: str
    gguf: Path
    port: int
    log_path: Path
    version: str

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def find_binary() -> str:
    """$ISLWATCH_LLAMA_SERVER, else the build script (which reuses its cache in well under a second)."""
    env = os.environ.get(ENV_BINARY)
    if env:
        if not os.access(env, os.X_OK):
            raise ServerFailed(f"{ENV_BINARY}={env} is not an executable file")
        return env
    proc = subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True, check=False)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines or not os.access(lines[-1], os.X_OK):
        tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
        raise BinaryUnavailable(f"llama-server is not built and {BUILD_SCRIPT.name} failed: {tail}")
    return lines[-1]


def tiny_gguf(family: str) -> Path:
    """The tiny GGUF of a family of GGUF or BUILT_GGUF, around its built test tokenizer folder: a skip when
    it cannot be built, a failure under CI."""
    from tests.conftest import shared_dir, unavailable

    try:
        return build_gguf(shared_dir(family), {**GGUF, **BUILT_GGUF}[family])
    except BinaryUnavailable as exc:
        unavailable(str(exc))


def build_gguf(tokenizer_dir: Path, arch: str) -> Path:
    """A tiny GGUF around a tokenizer folder: built once by the script (~1-3 minutes on 2 cores), then reused."""
    proc = subprocess.run(
        ["bash", str(GGUF_SCRIPT), str(tokenizer_dir), arch], capture_output=True, text=True, check=False
    )
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines or not Path(lines[-1]).is_file():
        tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
        raise BinaryUnavailable(f"no tiny {arch} GGUF: {GGUF_SCRIPT.name} failed: {tail}")
    return Path(lines[-1])


def binary_version(binary: str) -> str:
    """`llama-server --version` prints e.g. 'version: 0.5.0-dev (build 1, commit 0c1e570)' on stderr."""
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, check=False)
    for line in (out.stderr + out.stdout).splitlines():
        if line.startswith("version:"):
            return line.removeprefix("version:").strip()
    return "unknown"


def launch(binary: str, gguf: Path, port: int, log_path: Path) -> subprocess.Popen[bytes]:
    cmd = [binary, "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["-np", "1", "-t", "1", "--no-webui", "--metrics"]  # /metrics: test_llama_server_bill.py
    log = open(log_path, "wb")  # noqa: SIM115 - the child owns the handle for its lifetime
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def health(base_url: str) -> tuple[int, dict[str, object]]:
    """GET /health -> (status, JSON body); status 0 while nothing listens yet."""
    try:
        with urllib.request.urlopen(f"{base_url}/health", timeout=5) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as err:  # 503 {"error": {"message": "Loading model", ...}} while loading
        body = err.read()
        return err.code, json.loads(body) if body else {}
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return 0, {}


def wait_healthy(proc: subprocess.Popen[bytes], base_url: str, log_path: Path) -> list[int]:
    """Poll /health until 200; returns the statuses seen (503 while the model loads)."""
    seen: list[int] = []

    def probe() -> int | None:  # None once the server exited
        if proc.poll() is not None:
            return None
        status, _ = health(base_url)
        if not seen or seen[-1] != status:
            seen.append(status)
        return status

    try:
        status = eventually(
            probe,
            until=lambda status: status is None or status == 200,
            timeout=START_DEADLINE_SECONDS,
            what="llama-server healthy",
            interval=0.02,
        )
    except AssertionError as exc:
        raise ServerFailed(
            f"llama-server not healthy after {START_DEADLINE_SECONDS}s: {log_tail(log_path)}"
        ) from exc
    if status is None:
        raise ServerFailed(f"llama-server exited with {proc.returncode}: {log_tail(log_path)}")
    return seen


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def log_tail(log_path: Path, lines: int = 5) -> str:
    try:
        return " | ".join(log_path.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return "(no log)"
