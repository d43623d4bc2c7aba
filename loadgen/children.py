"""The demo's child processes: free ports, spawning `islwatch <command>`, waiting for ready, stopping.

Standard library only. The children die with the demo if it is killed outright (PR_SET_PDEATHSIG, Linux).
"""

from __future__ import annotations

import ctypes
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import suppress
from pathlib import Path

READY_TIMEOUT_S = 180.0  # a first run converts the built-in vocabulary once

Children = dict[str, tuple[subprocess.Popen[bytes], Path]]  # name -> (process, its log)


def free_port(host: str, wanted: int) -> int:
    """`wanted` if it can be bound, else any free port (the demo must not fail on a busy 9000)."""
    for port in (wanted, 0):
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return int(s.getsockname()[1])
    raise OSError(f"no free port on {host}")


def address(text: str) -> tuple[str, int]:
    """`HOST:PORT` (HOST may be empty: 127.0.0.1) -> (host, port)."""
    host, _, port = text.rpartition(":")
    return host or "127.0.0.1", int(port)


def _die_with_parent() -> None:  # runs in the child between fork and exec (Linux only)
    with suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def spawn(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    """`islwatch ARGS...` in a child process, its stdout and stderr to `log`."""
    out = log.open("wb")
    return subprocess.Popen(
        [sys.executable, "-m", "proxy.cli", *args],
        stdout=out,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
    )


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)  # both servers shut down gracefully on SIGTERM
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _check_alive(procs: Children) -> None:
    for name, (proc, log) in procs.items():
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"{name} exited with {proc.returncode}; its log ({log}):\n{tail}")


def wait_ready(url: str, procs: Children) -> None:
    """Until `url` answers 200. RuntimeError (with the log's tail) if a child exits or time runs out."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        _check_alive(procs)
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"not ready after {READY_TIMEOUT_S:.0f} s: {url}")
