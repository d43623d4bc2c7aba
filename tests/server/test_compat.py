"""The private internals of aiohttp and transformers islwatch uses (proxy/runtime/compat.py): checked at the
proxy's start-up, said plainly when the release is not the tested one, never a crash."""

from __future__ import annotations

import logging
import tomllib

import aiohttp
import pytest
from aiohttp import http_writer

from proxy.runtime import compat
from proxy.server.app import run_proxy
from proxy.server.headers import serialize_head
from tests.conftest import REPO
from tests.server.helpers import fetch_metrics, proxy_config, value


def test_the_installed_releases_are_the_tested_ones() -> None:
    """pyproject.toml pins the minor releases in compat.TESTED: an install from it passes the check."""
    deps = {d.library: d for d in compat.check()}
    assert set(deps) == set(compat.TESTED)
    for d in deps.values():
        assert (d.tested, d.problems) == (True, ()), d


def test_an_untested_release_is_said_in_one_line_not_raised(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(compat.TESTED, "aiohttp", "3.13")
    with caplog.at_level(logging.INFO, logger="islwatch.test"):
        deps = {d.library: d for d in compat.check(logging.getLogger("islwatch.test"))}
    assert not deps["aiohttp"].tested and deps["transformers"].tested
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and warnings[0].startswith(f"aiohttp {aiohttp.__version__} is not the release")


def test_a_moved_internal_is_a_problem_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(http_writer, "_serialize_headers")
    (aio,) = [d for d in compat.check() if d.library == "aiohttp"]
    assert not aio.tested and "_serialize_headers is gone" in aio.problems[0]


async def test_the_proxy_start_up_installs_the_head_writer_and_exports_the_check() -> None:
    async with run_proxy(proxy_config("http://127.0.0.1:9", tokenizer="none")) as urls:
        assert http_writer._serialize_headers is serialize_head
        async with aiohttp.ClientSession() as s:
            m = await fetch_metrics(s, urls.admin_url)
    for library in compat.TESTED:
        assert value(m, "islwatch_dependency_info", library=library, tested="true") == 1


def test_pyproject_pins_the_tested_minor_releases() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    for library, minor in compat.TESTED.items():
        major, number = minor.split(".")
        assert f"{library}>={minor},<{major}.{int(number) + 1}" in pyproject["project"]["dependencies"]
