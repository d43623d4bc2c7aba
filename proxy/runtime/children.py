"""The demo's child processes: free ports, spawning `islwatch <command>` (one scene's emulator and proxy),
waiting for ready, stopping.

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
from contextlib import ExitStack, suppress
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Addresses:
    """Where one emulator and the proxy in front of it listen."""

    host: str
    port: int
    admin_host: str
    admin_port: int
    emu_port: int

    @classmethod
    def choose(cls, listen: str, admin: str) -> Addresses:
        """The wanted addresses, or free ports on the same hosts where the wanted ones are taken."""
        host, want = address(listen)
        admin_host, admin_want = address(admin)
        port = free_port(host, want)
        admin_port = free_port(admin_host, admin_want)
        return cls(host, port, admin_host, admin_port, free_port("127.0.0.1", 0))

    @property
    def emu_url(self) -> str:
        return f"http://127.0.0.1:{self.emu_port}"

    @property
    def proxy_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def admin(self) -> str:
        return f"{self.admin_host}:{self.admin_port}"

    @property
    def admin_url(self) -> str:
        return f"http://{self.admin}"

    @property
    def metrics_url(self) -> str:
        return f"{self.admin_url}/metrics"


def spawn_stack(stack: ExitStack, at: Addresses, logs: Path, emulator: tuple[str, ...] = ()) -> Children:
    """The emulator (with `emulator` flags) and the proxy in front of it, started, not waited for;
    `stack` stops the proxy first, then its upstream."""
    emu = spawn(
        ["emulate", "--listen", f"127.0.0.1:{at.emu_port}", "--wall-clock", *emulator], logs / "emulate.log"
    )
    stack.callback(stop, emu)
    proxy = spawn(
        ["proxy", "--upstream", at.emu_url, "--listen", f"{at.host}:{at.port}", "--admin", at.admin],
        logs / "proxy.log",
    )
    stack.callback(stop, proxy)
    return {"emulator": (emu, logs / "emulate.log"), "proxy": (proxy, logs / "proxy.log")}


def wait_stack(at: Addresses, children: Children) -> None:
    """Until the emulator answers /health and the proxy /readyz (its tokenizer loaded)."""
    wait_ready(f"{at.emu_url}/health", children)
    wait_ready(f"{at.admin_url}/readyz", children)
