"""One demo scene's serving stack: where its emulator and proxy listen, starting them, waiting for both.

The processes are `islwatch emulate` and `islwatch proxy`, spawned by proxy/runtime/children.py.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from proxy.runtime.children import Child, address, free_port, spawn, stop, wait_ready


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


def spawn_stack(stack: ExitStack, at: Addresses, logs: Path, emulator: tuple[str, ...] = ()) -> list[Child]:
    """The emulator (with `emulator` flags) and the proxy in front of it, started, not waited for;
    `stack` stops the proxy first, then its upstream."""
    emu = spawn(
        ["emulate", "--listen", f"127.0.0.1:{at.emu_port}", "--wall-clock", *emulator],
        logs / "emulate.log",
        name="emulator",
    )
    stack.callback(stop, emu.proc)
    proxy = spawn(
        ["proxy", "--upstream", at.emu_url, "--listen", f"{at.host}:{at.port}", "--admin", at.admin],
        logs / "proxy.log",
        name="proxy",
    )
    stack.callback(stop, proxy.proc)
    return [emu, proxy]


def wait_stack(at: Addresses, children: list[Child]) -> None:
    """Until the emulator answers /health and the proxy /readyz (its tokenizer loaded)."""
    wait_ready(f"{at.emu_url}/health", children, interval=0.2)
    wait_ready(f"{at.admin_url}/readyz", children, interval=0.2)
