"""The CI rule for real servers (tests/conftest.py `unavailable`): a missing server or venv skips with its
reason on a developer's machine, and fails under CI (env `CI` set), where a skip would hide that nothing
was tested."""

from __future__ import annotations

import pytest

from tests.conftest import unavailable


def test_a_missing_server_skips_outside_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="vLLM is not installed"):
        unavailable("vLLM is not installed")


def test_a_missing_server_fails_under_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="vLLM is not installed"):
        unavailable("vLLM is not installed")
