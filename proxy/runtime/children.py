"""`islwatch` child processes, for the demo, the tests and the benches: free ports, spawning
`islwatch <command>` (or another `python -m` module), waiting until a URL answers, stopping.

Standard library only. A child dies with its parent if the parent is killed outright (PR_SET_PDEATHSIG,
Linux), so an interrupted demo or test run leaves no server behind.
"""

from __future__ import annotations

import ctypes
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

READY_TIMEOUT_S = 180.0  # a first run converts the built-in vocabulary once; a guard, not a timing
STOP_TIMEOUT_S = 15.0


class ChildFailed(RuntimeError):
    """A child exited before it was ready, or was not ready in time (the message holds its log's tail)."""


def free_port(host: str = "127.0.0.1", wanted: int = 0) -> int:
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


@dataclass(frozen=True)
class Child:
    """One child process and the file its stdout and stderr go to (None: discarded)."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path | None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_tail(self, chars: int = 3000) -> str:
        if self.log is None:
            return "(no log kept)"
        return self.log.read_text(errors="replace")[-chars:]


def _die_with_parent() -> None:  # runs in the child between fork and exec (Linux only)
    with suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def spawn(
    args: list[str],
    log: Path | None,
    *,
    module: str = "proxy.cli",
    name: str | None = None,
    env: Mapping[str, str] | None = None,
    append: bool = False,
    die_with_parent: bool = True,
) -> Child:
    """`python -m MODULE ARGS...` (by default `islwatch ARGS...`) in a child process, its stdout and stderr
    to `log` (appended with `append`: a restarted child keeps one log). `die_with_parent` only from a
    thread that outlives the child: PR_SET_PDEATHSIG fires when the thread that spawned it exits
    (prctl(2)), not the process."""
    out = log.open("ab" if append else "wb") if log is not None else subprocess.DEVNULL
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", module, *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=None if env is None else dict(env),
            preexec_fn=_die_with_parent if die_with_parent and sys.platform.startswith("linux") else None,
        )
    finally:
        if not isinstance(out, int):
            out.close()  # the child holds its own copy
    return Child(name or (args[0] if args else module), proc, log)


def status(url: str, timeout: float = 5.0) -> int:
    """The HTTP status `url` answers with, 0 if nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as err:
        return err.code
    except OSError:
        return 0


def check_alive(children: Iterable[Child]) -> None:
    for child in children:
        if child.proc.poll() is not None:
            raise ChildFailed(
                f"{child.name} exited with {child.proc.returncode}; its log ({child.log}):\n{child.log_tail()}"
            )


def wait_ready(
    url: str, children: Iterable[Child], timeout: float = READY_TIMEOUT_S, interval: float = 0.05
) -> None:
    """Until `url` answers 200. ChildFailed (with the log's tail) if a child exits first or time runs out."""
    watched = list(children)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        check_alive(watched)
        if status(url, timeout=2) == 200:
            return
        time.sleep(interval)
    tails = "\n".join(f"{c.name}:\n{c.log_tail()}" for c in watched)
    raise ChildFailed(f"not ready after {timeout:.0f} s: {url}\n{tails}")


def stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM, timeout: float = STOP_TIMEOUT_S) -> None:
    """`sig` (islwatch's servers shut down gracefully on SIGTERM), then SIGKILL after `timeout`."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
