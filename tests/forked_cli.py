"""`islwatch` commands, each in a child process of its own, forked from one interpreter that has already
imported the CLI: a run still has its own process, exit code, output and environment, and a traceback that
escapes `main` is printed as the interpreter prints it, but Python's start-up and the CLI's imports (about
0.5 s of CPU a run) are paid once. For tests that run many short commands, such as start-up errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType

import pytest

REPO = Path(__file__).resolve().parents[1]
# What `islwatch count` imports when it runs (proxy/cli/count.py), to preload.
COUNT_IMPORTS = (
    "orjson",
    "proxy.cli.count",
    "proxy.core.count",
    "proxy.core.model",
    "proxy.core.renderers.mistral",
    "proxy.core.tokenizer",
)

# The fork server: reads one request a line ({argv, env, cwd, stdin, out, err, timeout}), forks, runs
# `main(argv)` in the child with that environment, folder and input, its stdout in `out` and its stderr in
# `err`, and answers the child's exit code
# (null when it outlived `timeout` and was killed). The server itself stays single-threaded, so forking it is
# safe.
SERVER = r"""
import json, os, select, signal, sys, traceback
from proxy.cli import main
for module in sys.argv[1:]:
    __import__(module)

def child(req):
    os.setpgid(0, 0)  # a group of its own: a kill on timeout reaches the processes it started too
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    os.dup2(os.open(req["out"], flags), 1)
    os.dup2(os.open(req["err"], flags), 2)
    os.dup2(os.open(req["stdin"], os.O_RDONLY), 0)
    os.environ.clear()
    os.environ.update(req["env"])
    os.chdir(req["cwd"])
    try:
        code = main(req["argv"])
    except SystemExit as exc:  # what the interpreter makes of sys.exit()
        code = exc.code
        if code is not None and not isinstance(code, int):
            print(code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code or 0)

for line in sys.stdin:
    req = json.loads(line)
    pid = os.fork()
    if pid == 0:
        child(req)
    pidfd = os.pidfd_open(pid)
    done = select.select([pidfd], [], [], req["timeout"])[0]
    if not done:
        os.killpg(pid, signal.SIGKILL)
    status = os.waitpid(pid, 0)[1]
    os.close(pidfd)
    print(json.dumps(os.waitstatus_to_exitcode(status) if done else None), flush=True)
"""


class ForkedCli:
    """A fork server for `islwatch` runs; `preload`: modules imported once, before any fork (the ones the
    command under test imports when it runs)."""

    def __init__(self, preload: Sequence[str] = ()) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ISLWATCH_")}
        env["PYTHONPATH"] = str(REPO)
        self._folder = tempfile.TemporaryDirectory(prefix="forked-cli-")
        self._runs = 0
        self._proc = subprocess.Popen(
            [sys.executable, "-c", SERVER, *preload], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True, env=env, cwd=REPO,
        )  # fmt: skip

    def run(
        self,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        stdin: bytes = b"",
        timeout: float = 120,
    ) -> subprocess.CompletedProcess[bytes]:
        """`islwatch argv...` with `env` as its environment (default: this process's), `stdin` as its input:
        its exit code, stdout and stderr, as subprocess.run gives them."""
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._runs += 1
        files = {k: Path(self._folder.name) / f"run-{self._runs}.{k}" for k in ("stdin", "out", "err")}
        files["stdin"].write_bytes(stdin)
        request = {
            "argv": list(argv),
            "env": dict(os.environ if env is None else env),
            "cwd": str(cwd or REPO),
            **{k: str(v) for k, v in files.items()},
        }
        self._proc.stdin.write(json.dumps({**request, "timeout": timeout}) + "\n")
        self._proc.stdin.flush()
        reply = self._proc.stdout.readline()
        assert reply, f"the fork server exited ({self._proc.wait()})"
        code = json.loads(reply)
        out, err = files["out"].read_bytes(), files["err"].read_bytes()
        assert code is not None, f"islwatch {' '.join(argv)} still ran after {timeout} s:\n{out!r}\n{err!r}"
        return subprocess.CompletedProcess(["islwatch", *argv], int(code), out, err)

    def close(self) -> None:
        if self._proc.stdin is not None:
            self._proc.stdin.close()
        self._proc.wait(timeout=60)
        self._folder.cleanup()

    def __enter__(self) -> ForkedCli:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class Forks:
    """One fork server for a test module: `FORKS = Forks(preload)` and `forks = FORKS.fixture()` at the
    module's top level, then `FORKS.cli.run(...)` in its tests."""

    def __init__(self, preload: Sequence[str] = ()) -> None:
        self._preload = tuple(preload)
        self._cli: ForkedCli | None = None

    @property
    def cli(self) -> ForkedCli:
        assert self._cli is not None, "the module's fork server runs only while its tests do"
        return self._cli

    def fixture(self) -> Callable[[], Iterator[None]]:
        @pytest.fixture(autouse=True, scope="module")
        def forks() -> Iterator[None]:
            with ForkedCli(self._preload) as cli:
                self._cli = cli
                yield
            self._cli = None

        return forks  # type: ignore[no-any-return]
