"""Running `islwatch demo` as a user does (a subprocess of the real CLI) and reading what it shows."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

from tests.eventually import eventually
from tests.server.helpers import parse_metrics

DEMO = [sys.executable, "-m", "proxy.cli", "demo", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"]
TIMEOUT_S = 300
SERVING = "Serving until Ctrl-C"


def interruptible() -> None:
    """SIGINT as a terminal leaves it: a suite started in the background (`cmd &` in a script) runs with
    SIGINT ignored, which its children inherit, and Python then installs no KeyboardInterrupt handler."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    out: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.add(child)
            todo.append(child)
    return out


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def read_lines(proc: subprocess.Popen[str]) -> list[str]:
    """The lines `proc` prints, collected by a thread as they arrive."""
    lines: list[str] = []

    def collect() -> None:
        for line in proc.stdout or []:
            lines.append(line)

    threading.Thread(target=collect, daemon=True).start()
    return lines


def wait_serving(proc: subprocess.Popen[str], lines: list[str]) -> str:
    """Until the demo says it serves (its output so far); fails at once, with the output, if it exits first."""
    text, code = eventually(
        lambda: ("".join(lines), proc.poll()),
        until=lambda seen: SERVING in seen[0] or seen[1] is not None,
        timeout=TIMEOUT_S,
        what="the demo serving",
    )
    assert SERVING in text, f"demo exited with {code} before serving:\n{text}"
    return text


def summary(stdout: str) -> dict[str, list[str]]:
    """The summary table's rows: scene -> [requests, exact, median drift, cause, alert]."""
    table = stdout.rsplit("scene by scene", 1)[1]
    rows = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("│").split("│")]
        if len(cells) == 6 and cells[0] and cells[1].isdigit():
            rows[cells[0]] = cells[1:]
    return rows


def metrics_url(stdout: str) -> str:
    found = re.search(r"The proxy's metrics: (http://\S+/metrics)", stdout)
    assert found, stdout
    return found[1]


def scrape(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of the proxy's /metrics, by name and labels (model and endpoint included)."""
    with urllib.request.urlopen(url, timeout=5) as resp:
        return parse_metrics(resp.read().decode())
