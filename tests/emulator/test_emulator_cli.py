"""`islwatch emulate` as a command: flag errors exit 2, a real process serves and stops on SIGTERM, and the
subcommand's parser is built without loading aiohttp or transformers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import orjson
import pytest

from proxy.cli import main as cli_main
from proxy.cli.emulate import parse_listen
from tests.conftest import REPO, load_builtin
from tests.emulator.emulator_helpers import FRANCE, direct_count

ENV = {**os.environ, "PYTHONPATH": str(REPO)}


def test_cli_bad_fault_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["emulate", "--fault", "status=999"]) == 2
    assert "between 400 and 599" in capsys.readouterr().err


def test_cli_bad_listen_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["emulate", "--listen", "localhost"]) == 2
    assert "HOST:PORT" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "address"),
    [("127.0.0.1:8000", ("127.0.0.1", 8000)), (":9000", ("127.0.0.1", 9000)), ("[::1]:80", ("::1", 80))],
)
def test_parse_listen(text: str, address: tuple[str, int]) -> None:
    assert parse_listen(text) == address


@pytest.mark.parametrize("text", ["localhost", "host:port", "host:70000"])
def test_parse_listen_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="HOST:PORT"):
        parse_listen(text)


def test_configure_imports_no_heavy_module() -> None:
    """`islwatch emulate --help` stays fast: the subcommand module loads neither aiohttp nor transformers."""
    heavy = ("aiohttp", "transformers", "proxy.core.tokenizer", "proxy.emulator.app")
    code = (
        "import argparse, sys\n"
        "from proxy.cli import emulate\n"
        "emulate.configure(argparse.ArgumentParser())\n"
        f"print(sorted(m for m in {heavy!r} if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, check=True)
    assert out.stdout.strip() == "[]"


def test_cli_serves_and_stops_on_sigterm() -> None:
    """`islwatch emulate` as a process: ready line with the bound port, a real request, clean exit."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "proxy.cli",
            "emulate",
            "--listen",
            "127.0.0.1:0",
            "--model",
            "m",
            "--fault",
            "system-prompt=3",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("islwatch emulate: listening on http://127.0.0.1:"), line
        url = line.rsplit(" ", 1)[1].strip()
        body = orjson.dumps({"model": "m", "messages": FRANCE})
        out = subprocess.run(
            [
                "curl",
                "-sS",
                "-H",
                "Content-Type: application/json",
                "--data-binary",
                "@-",
                url + "/v1/chat/completions",
            ],
            input=body,
            capture_output=True,
            check=True,
            timeout=30,
        )
        usage = orjson.loads(out.stdout)["usage"]
        assert usage["prompt_tokens"] == direct_count(load_builtin().tokenizer, FRANCE) + 3
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
