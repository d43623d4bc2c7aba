"""`islwatch demo`: the emulator, the proxy in front of it, and a short exactly budgeted load through both.

Offline and GPU-free: the tokenizer is the Mistral v0.1 vocabulary that mistral-common ships. Its chat
template rejects a system role, so the demo's conversations are user/assistant turns, marked on the first
user turn. The emulator and the proxy run as child processes (as they would in production); the demo stops
them on exit, on Ctrl-C and on SIGTERM, and they die with it if it is killed outright (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import argparse
import ctypes
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import ExitStack, suppress
from pathlib import Path

from rich.console import Console

from proxy.core.specs import DEFAULT_TOKENIZER
from proxy.core.tokenizer import load_tokenizer

from .cli import run_loadgen, write_outputs
from .config import LoadgenConfig
from .markers import CacheBust

READY_TIMEOUT_S = 180.0  # a first run converts the built-in vocabulary once


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--listen", default="127.0.0.1:9000", help="proxy traffic address (default 127.0.0.1:9000)"
    )
    p.add_argument(
        "--admin", default="127.0.0.1:9100", help="proxy /metrics address (default 127.0.0.1:9100)"
    )
    p.add_argument("--requests", type=int, default=40, help="requests to send (default 40)")
    p.add_argument("--isl", type=int, default=256, help="tokens per user turn (default 256)")
    p.add_argument("--osl", type=int, default=32, help="max_tokens (default 32)")
    p.add_argument("--turns", type=int, default=2, help="turns per conversation (default 2)")
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--keep-running", action="store_true", help="keep emulator and proxy serving until Ctrl-C")
    p.add_argument("--output", type=Path, help="write the report as JSON")
    p.add_argument("--records", type=Path, help="write one JSON line per request")


def _free_port(host: str, wanted: int) -> int:
    """`wanted` if it can be bound, else any free port (the demo must not fail on a busy 9000)."""
    for port in (wanted, 0):
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return int(s.getsockname()[1])
    raise OSError(f"no free port on {host}")


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host or "127.0.0.1", int(port)


def _die_with_parent() -> None:  # runs in the child between fork and exec (Linux only)
    with suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _spawn(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    out = log.open("wb")
    return subprocess.Popen(
        [sys.executable, "-m", "proxy.cli", *args],
        stdout=out,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
    )


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)  # both servers shut down gracefully on SIGTERM
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait_ready(url: str, procs: dict[str, tuple[subprocess.Popen[bytes], Path]]) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        for name, (proc, log) in procs.items():
            if proc.poll() is not None:
                tail = log.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{name} exited with {proc.returncode}; its log ({log}):\n{tail}")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"not ready after {READY_TIMEOUT_S:.0f} s: {url}")


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def run(args: argparse.Namespace) -> int:
    console = Console()
    signal.signal(signal.SIGTERM, _raise_interrupt)  # SIGTERM stops the demo like Ctrl-C: children first
    console.print(f"islwatch demo: loading {DEFAULT_TOKENIZER} (offline, from mistral-common)")
    load_tokenizer(DEFAULT_TOKENIZER)  # converts the vocabulary once, before two children race to do it
    host, want = _address(args.listen)
    admin_host, admin_want = _address(args.admin)
    port = _free_port(host, want)
    admin_port = _free_port(admin_host, admin_want)
    emu_port = _free_port("127.0.0.1", 0)
    emu_url = f"http://127.0.0.1:{emu_port}"
    proxy_url = f"http://{host}:{port}"
    metrics_url = f"http://{admin_host}:{admin_port}/metrics"
    logs = Path(tempfile.mkdtemp(prefix="islwatch-demo-"))
    with ExitStack() as stack:
        try:
            emu = _spawn(
                ["emulate", "--listen", f"127.0.0.1:{emu_port}", "--wall-clock"], logs / "emulate.log"
            )
            stack.callback(_stop, emu)
            proxy = _spawn(
                [
                    "proxy",
                    "--upstream",
                    emu_url,
                    "--listen",
                    f"{host}:{port}",
                    "--admin",
                    f"{admin_host}:{admin_port}",
                ],
                logs / "proxy.log",
            )
            stack.callback(_stop, proxy)  # stopped first: the proxy, then its upstream
            children = {"emulator": (emu, logs / "emulate.log"), "proxy": (proxy, logs / "proxy.log")}
            _wait_ready(f"{emu_url}/health", children)
            _wait_ready(f"http://{admin_host}:{admin_port}/readyz", children)
            console.print(
                f"emulator (pid {emu.pid}) on {emu_url}; proxy (pid {proxy.pid}) on {proxy_url} -> emulator; "
                f"logs in {logs}"
            )
            cfg = LoadgenConfig(
                url=proxy_url,
                isl=args.isl,
                osl=args.osl,
                turns=args.turns,
                cache_bust=CacheBust.FIRST_TURN_PREFIX,
                concurrency=args.concurrency,
                request_count=args.requests,
                streaming=True,
                proxy_metrics_url=metrics_url,
                output=args.output,
                records=args.records,
            )
            code, report = run_loadgen(cfg, console)
            if report is None:
                return code
            console.print(f"\nThe proxy's Prometheus metrics: [bold]{metrics_url}[/]")
            if not args.keep_running:
                console.print(
                    "Stopping the proxy and the emulator (`islwatch demo --keep-running` keeps them up)."
                )
                return code
            console.print(f"Try: curl -s {metrics_url} | grep islwatch_isl_match")
            console.print(f"Send your own traffic through the proxy: {proxy_url}/v1/chat/completions")
            if args.keep_running:
                console.print("Serving until Ctrl-C.")
                while all(p.poll() is None for p in (emu, proxy)):
                    time.sleep(0.5)
                console.print("[red]a child process exited; stopping[/]")
                return 1
            return code
        except KeyboardInterrupt:
            console.print("\nislwatch demo: interrupted, stopping the proxy and the emulator")
            return 130
        except RuntimeError as exc:
            console.print(f"[red]islwatch demo: {exc}[/]")
            return 1


__all__ = ["configure", "run", "write_outputs"]
