"""Every configuration error `islwatch proxy` can meet at start-up ends it with one line naming the problem
and a non-zero exit, never a traceback: invalid values and files (exit 2), and addresses it cannot listen
on (exit 1), including an admin port already taken while the analysis workers are still loading (the
start-up is cancelled under them: that once printed an asyncio traceback, in 1-3 runs of 3). Run as
operators run it, the CLI in a child process: forked from one interpreter that has imported the CLI
(tests/forked_cli.py), and `python -m proxy.cli` itself for one error of each exit code."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.forked_cli import Forks

ROOT = Path(__file__).resolve().parents[2]
GUARD_SECONDS = 120  # a guard against a hung start, not a timing assertion
UPSTREAM = ["--upstream", "http://127.0.0.1:9"]
FREE = ["--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"]


# What `islwatch proxy` imports when it runs, loaded once before the forks.
PRELOAD = ("proxy.cli.proxy", "proxy.runtime.loop", "proxy.server.app", "proxy.server.config")
FORKS = Forks(PRELOAD)
forks = FORKS.fixture()


def islwatch_proxy(
    *args: str,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    top: tuple[str, ...] = (),
    fresh: bool = False,
) -> tuple[int, str]:
    """`islwatch [top...] proxy args...` with no ISLWATCH_ variable but those in `env`: a child forked from
    the CLI already imported, or with `fresh` a new `python -m proxy.cli` process."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("ISLWATCH_")}
    environ.update({"PYTHONPATH": str(ROOT), **(env or {})})
    argv = [*top, "proxy", *args]
    if not fresh:
        ran = FORKS.cli.run(argv, environ, cwd=cwd, timeout=GUARD_SECONDS)
        return ran.returncode, (ran.stdout + ran.stderr).decode()
    done = subprocess.run(
        [sys.executable, "-m", "proxy.cli", *argv], capture_output=True, text=True,
        env=environ, timeout=GUARD_SECONDS, stdin=subprocess.DEVNULL, cwd=cwd,
    )  # fmt: skip
    return done.returncode, done.stdout + done.stderr


def assert_one_line_error(code: int, out: str, want_code: int, want: str) -> None:
    assert code == want_code, out
    assert want in out, out
    assert "Traceback" not in out and "Exception in callback" not in out, out


@contextmanager
def taken_port() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


@pytest.mark.parametrize(
    ("args", "want"),
    [
        (["--max-connections", "0", *FREE], "max_connections"),
        (["--upstream-max-field-bytes", "10", *FREE], "upstream_max_field_bytes"),
        (["--max-inflight-body-bytes", "0", *FREE], "max_inflight_body_bytes"),
        (["--admin-max-requests", "0", *FREE], "admin_max_requests"),
        (["--listen", "127.0.0.1:99999", "--admin", "127.0.0.1:0"], "listen"),
        (["--config", "/nonexistent/islwatch.yaml", *FREE], "config file"),
        (["--analysis-sample-rate", "2", *FREE], "analysis_sample_rate"),
    ],
)
def test_invalid_settings_exit_2_with_the_key(args: list[str], want: str) -> None:
    assert_one_line_error(*islwatch_proxy(*UPSTREAM, *args), 2, want)


def test_the_command_itself_exits_2_and_1() -> None:
    """The forks above run `main` as `python -m proxy.cli` does; here the command itself, from a new
    interpreter, for one error of each exit code."""
    assert_one_line_error(
        *islwatch_proxy(*UPSTREAM, "--max-connections", "0", *FREE, fresh=True), 2, "max_connections"
    )
    with taken_port() as port:
        out = islwatch_proxy(*UPSTREAM, "--listen", f"127.0.0.1:{port}", "--admin", "127.0.0.1:0", fresh=True)
    assert_one_line_error(*out, 1, "address already in use")


@pytest.mark.parametrize(
    ("args", "want"),
    [
        ([*FREE], "upstream: required"),
        (["--model-tokenizer", "no-equals-sign", *UPSTREAM, *FREE], "model_tokenizers"),
        (["--default-chat-template-kwargs", "{not json", *UPSTREAM, *FREE], "default_chat_template_kwargs"),
        (["--harmony-start-date", "2025", *UPSTREAM, *FREE], "harmony_start_date"),
        (["--upstream-metrics-url", "ftp://x", *UPSTREAM, *FREE], "upstream_metrics_url"),
        (["--upstream-health-path", "health", *UPSTREAM, *FREE], "upstream_health_path"),
        (["--listen", "no-port", "--admin", "127.0.0.1:0", *UPSTREAM], "listen"),
        (["--max-connections", "many", *UPSTREAM, *FREE], "--max-connections"),  # argparse's own refusal
    ],
)
def test_other_invalid_values_exit_2_too(args: list[str], want: str) -> None:
    assert_one_line_error(*islwatch_proxy(*args), 2, want)


def test_an_invalid_environment_value_names_its_source() -> None:
    code, out = islwatch_proxy(*UPSTREAM, *FREE, env={"ISLWATCH_MAX_CONNECTIONS": "many"})
    assert_one_line_error(code, out, 2, "max_connections")
    assert "(from environment)" in out


def test_an_unknown_log_level() -> None:
    """`--log-level` is the top-level parser's: an unknown level once raised out of logging.basicConfig."""
    code, out = islwatch_proxy(*UPSTREAM, *FREE, top=("--log-level", "loud"))
    assert_one_line_error(code, out, 2, "--log-level")


def test_a_config_file_that_is_not_yaml(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("listen: [unclosed\n")
    assert_one_line_error(*islwatch_proxy(*UPSTREAM, *FREE, "--config", str(bad)), 2, "not valid YAML")


@pytest.mark.parametrize(
    ("text", "want"),
    [("- a\n- b\n", "expected a mapping of keys"), ("no_such_key: 1\n", "no_such_key: unknown key")],
)
def test_a_config_file_with_the_wrong_shape_or_an_unknown_key(tmp_path: Path, text: str, want: str) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    assert_one_line_error(*islwatch_proxy(*UPSTREAM, *FREE, "--config", str(bad)), 2, want)


def test_a_config_file_named_in_the_environment_that_is_missing(tmp_path: Path) -> None:
    missing = str(tmp_path / "absent.yaml")
    code, out = islwatch_proxy(*UPSTREAM, *FREE, env={"ISLWATCH_CONFIG": missing})
    assert_one_line_error(code, out, 2, "config file")


def test_an_upstream_that_is_not_a_url() -> None:
    assert_one_line_error(*islwatch_proxy("--upstream", "ftp://x", *FREE), 2, "upstream")


def test_the_traffic_port_in_use() -> None:
    with taken_port() as port:
        out = islwatch_proxy(*UPSTREAM, "--listen", f"127.0.0.1:{port}", "--admin", "127.0.0.1:0")
    assert_one_line_error(*out, 1, "address already in use")


@pytest.mark.parametrize("which", ["--listen", "--admin"])
def test_an_address_not_on_this_host(which: str) -> None:
    addresses = {"--listen": "127.0.0.1:0", "--admin": "127.0.0.1:0", which: "192.0.2.1:0"}
    out = islwatch_proxy(*UPSTREAM, *(x for kv in addresses.items() for x in kv), "--tokenizer", "none")
    assert_one_line_error(*out, 1, "cannot assign requested address")


def test_a_host_that_does_not_resolve() -> None:
    out = islwatch_proxy(*UPSTREAM, "--listen", "no-such-host.invalid:0", "--admin", "127.0.0.1:0")
    assert_one_line_error(*out, 1, "islwatch proxy:")


@pytest.mark.slow  # three new interpreters, each starting its analysis workers
def test_the_admin_port_in_use_while_workers_load() -> None:
    """The traffic port is bound and the analysis workers are starting when the admin port fails: the
    start-up is cancelled under them. Three at once (the race showed in 1-3 runs of 3), each a new
    interpreter as operators start it."""
    with taken_port() as port, ThreadPoolExecutor(3) as pool:
        args = (*UPSTREAM, "--listen", "127.0.0.1:0", "--admin", f"127.0.0.1:{port}")
        runs = list(pool.map(lambda _: islwatch_proxy(*args, fresh=True), range(3)))
    for out in runs:
        assert_one_line_error(*out, 1, "address already in use")
