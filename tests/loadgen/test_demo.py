"""`islwatch demo` end to end in a subprocess: it finishes on its own, and Ctrl-C leaves no process behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import orjson
import pytest

from tests.conftest import REPO
from tests.eventually import eventually

DEMO = [sys.executable, "-m", "proxy.cli", "demo", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"]
TIMEOUT_S = 300


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


def test_demo_runs_to_the_end(tmp_path: Path) -> None:
    out = subprocess.run(
        [*DEMO, "--requests", "6", "--output", str(tmp_path / "r.json")],
        cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT_S,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "/metrics" in out.stdout
    assert "proxy's own match" in out.stdout
    report = orjson.loads((tmp_path / "r.json").read_bytes())
    assert report["requests"] == 6 and report["isl"]["server_exact"] == 6
    assert report["proxy"]["islwatch_isl_match_total"] == {"exact": 6.0}


def read_lines(proc: subprocess.Popen[str]) -> list[str]:
    """The lines `proc` prints, collected by a thread as they arrive."""
    lines: list[str] = []

    def collect() -> None:
        for line in proc.stdout or []:
            lines.append(line)

    threading.Thread(target=collect, daemon=True).start()
    return lines


def wait_serving(proc: subprocess.Popen[str], lines: list[str]) -> None:
    """Until the demo says it serves; fails at once (with its output) if it exits first."""
    text, code = eventually(
        lambda: ("".join(lines), proc.poll()),
        until=lambda seen: "Serving until Ctrl-C" in seen[0] or seen[1] is not None,
        timeout=TIMEOUT_S,
        what="the demo serving",
    )
    assert "Serving until Ctrl-C" in text, f"demo exited with {code} before serving:\n{text}"


@pytest.mark.parametrize("group", [True, False], ids=["ctrl-c-group", "sigint-demo-only"])
def test_ctrl_c_leaves_no_orphans(group: bool) -> None:
    proc = subprocess.Popen(
        [*DEMO, "--requests", "4", "--keep-running"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    lines = read_lines(proc)
    try:
        wait_serving(proc, lines)
        kids = descendants(proc.pid)
        assert len(kids) >= 2  # the emulator and the proxy (and the proxy's analysis worker)
        if group:
            os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole foreground group
        else:
            proc.send_signal(signal.SIGINT)  # only the demo: it must stop its children itself
        proc.wait(timeout=60)
        eventually(lambda: [k for k in kids if alive(k)], until=lambda left: not left, timeout=10,
                   what="every child of the demo exiting")  # fmt: skip
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
