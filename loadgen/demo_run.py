"""The work behind `islwatch demo` (see loadgen/demo.py): start the emulator and the proxy, send the load
through the proxy, print where to look, and stop both children on every way out."""

from __future__ import annotations

import argparse
import signal
import subprocess
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from proxy.core.specs import DEFAULT_TOKENIZER
from proxy.core.tokenizer import load_tokenizer

from .children import Children, address, free_port, spawn, stop, wait_ready
from .config import LoadgenConfig
from .launch import run_loadgen
from .markers import CacheBust


@dataclass(frozen=True)
class Addresses:
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
    def admin_url(self) -> str:
        return f"http://{self.admin_host}:{self.admin_port}"

    @property
    def metrics_url(self) -> str:
        return f"{self.admin_url}/metrics"


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def start_children(stack: ExitStack, at: Addresses, logs: Path) -> Children:
    """The emulator and the proxy in front of it, both ready; `stack` stops the proxy first, then its upstream."""
    emu = spawn(["emulate", "--listen", f"127.0.0.1:{at.emu_port}", "--wall-clock"], logs / "emulate.log")
    stack.callback(stop, emu)
    proxy = spawn(
        [
            "proxy",
            "--upstream",
            at.emu_url,
            "--listen",
            f"{at.host}:{at.port}",
            "--admin",
            f"{at.admin_host}:{at.admin_port}",
        ],
        logs / "proxy.log",
    )
    stack.callback(stop, proxy)
    children = {"emulator": (emu, logs / "emulate.log"), "proxy": (proxy, logs / "proxy.log")}
    wait_ready(f"{at.emu_url}/health", children)
    wait_ready(f"{at.admin_url}/readyz", children)
    return children


def demo_config(args: argparse.Namespace, at: Addresses) -> LoadgenConfig:
    return LoadgenConfig(
        url=at.proxy_url,
        isl=args.isl,
        osl=args.osl,
        turns=args.turns,
        cache_bust=CacheBust.FIRST_TURN_PREFIX,
        concurrency=args.concurrency,
        request_count=args.requests,
        streaming=True,
        proxy_metrics_url=at.metrics_url,
        output=args.output,
        records=args.records,
    )


def serve_until_ctrl_c(console: Console, at: Addresses, procs: list[subprocess.Popen[bytes]]) -> int:
    console.print(f"Try: curl -s {at.metrics_url} | grep islwatch_isl_match")
    console.print(f"Send your own traffic through the proxy: {at.proxy_url}/v1/chat/completions")
    console.print("Serving until Ctrl-C.")
    while all(p.poll() is None for p in procs):
        time.sleep(0.5)
    console.print("[red]a child process exited; stopping[/]")
    return 1


def _demo(args: argparse.Namespace, console: Console, at: Addresses, logs: Path, stack: ExitStack) -> int:
    children = start_children(stack, at, logs)
    (emu, _), (proxy, _) = children["emulator"], children["proxy"]
    console.print(
        f"emulator (pid {emu.pid}) on {at.emu_url}; proxy (pid {proxy.pid}) on {at.proxy_url} -> emulator; "
        f"logs in {logs}"
    )
    code, report = run_loadgen(demo_config(args, at), console)
    if report is None:
        return code
    console.print(f"\nThe proxy's Prometheus metrics: [bold]{at.metrics_url}[/]")
    if not args.keep_running:
        console.print("Stopping the proxy and the emulator (`islwatch demo --keep-running` keeps them up).")
        return code
    return serve_until_ctrl_c(console, at, [emu, proxy])


def run_demo(args: argparse.Namespace) -> int:
    console = Console()
    signal.signal(signal.SIGTERM, _raise_interrupt)  # SIGTERM stops the demo like Ctrl-C: children first
    console.print(f"islwatch demo: loading {DEFAULT_TOKENIZER} (offline, from mistral-common)")
    load_tokenizer(DEFAULT_TOKENIZER)  # converts the vocabulary once, before two children race to do it
    at = Addresses.choose(args.listen, args.admin)
    logs = Path(tempfile.mkdtemp(prefix="islwatch-demo-"))
    with ExitStack() as stack:
        try:
            return _demo(args, console, at, logs, stack)
        except KeyboardInterrupt:
            console.print("\nislwatch demo: interrupted, stopping the proxy and the emulator")
            return 130
        except RuntimeError as exc:
            console.print(f"[red]islwatch demo: {exc}[/]")
            return 1
