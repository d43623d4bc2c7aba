"""Contradictions are refused with a clear message before any request is sent."""

from __future__ import annotations

from typing import get_args

import pytest
from pydantic import ValidationError

from loadgen import cli
from loadgen.config import LoadgenConfig
from proxy.cli import build_parser
from proxy.core.endpoints import SHAPES, Endpoint

BASE = {"url": "http://127.0.0.1:1", "isl": 100, "concurrency": 1, "request_count": 1}


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            {"endpoint": "completions", "cache_bust": "first_turn_prefix"},
            "--cache-bust needs --endpoint chat",
        ),
        ({"endpoint": "embeddings", "cache_bust": "system_suffix"}, "--cache-bust needs --endpoint chat"),
        ({"endpoint": "completions", "turns": 3}, "--turns > 1 needs --endpoint chat"),
        ({"endpoint": "completions", "shared_system_prompt_length": 10}, "needs --endpoint chat"),
        ({"endpoint": "embeddings", "streaming": True}, "--streaming does not apply"),
        ({"request_rate": 5.0}, "exactly one of --concurrency"),
        ({"duration": 5.0}, "exactly one of --request-count"),
        ({"shared_system_prompt_length": 100}, "leaves no room in --isl 100"),
        ({"workers": 2}, "smaller than --workers 2"),
        ({"isl_stddev": 100.0}, "--isl-stddev must be smaller"),
    ],
)
def test_contradictions_are_refused(extra: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message.replace("(", r"\(").replace("+", r"\+")):
        LoadgenConfig(**{**BASE, **extra})


def test_neither_load_mode_is_refused() -> None:
    with pytest.raises(ValidationError, match="exactly one of --concurrency"):
        LoadgenConfig(url="http://x", isl=10, request_count=1)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://127.0.0.1:1", "http://127.0.0.1:1/v1/chat/completions"),
        ("http://h:2/v1/", "http://h:2/v1/chat/completions"),
    ],
)
def test_endpoint_url(url: str, expected: str) -> None:
    assert LoadgenConfig(**{**BASE, "url": url}).endpoint_url == expected


@pytest.mark.parametrize("endpoint", cli.ENDPOINTS)
def test_endpoint_url_comes_from_the_endpoint_table(endpoint: Endpoint) -> None:
    cfg = LoadgenConfig(**{**BASE, "endpoint": endpoint.value})
    assert cfg.endpoint_url == "http://127.0.0.1:1" + SHAPES[endpoint].path


def test_cli_offers_the_endpoints_the_config_accepts() -> None:
    accepted = get_args(LoadgenConfig.model_fields["endpoint"].annotation)
    assert sorted(accepted) == sorted(e.value for e in cli.ENDPOINTS)


def run_cli(argv: list[str]) -> int:
    args = build_parser().parse_args(["loadgen", *argv])
    return cli.run(args)


def test_cli_refuses_before_sending(capsys: pytest.CaptureFixture[str]) -> None:
    # Port 1 is never listening: a request would fail differently; the refusal comes first.
    code = run_cli(
        [
            "--url",
            "http://127.0.0.1:1",
            "--isl",
            "64",
            "--endpoint",
            "completions",
            "--turns",
            "2",
            "--concurrency",
            "1",
            "--request-count",
            "1",
        ]
    )
    assert code == 2
    assert "--turns > 1 needs --endpoint chat" in capsys.readouterr().err


def test_cli_refuses_a_target_below_the_template_cost(capsys: pytest.CaptureFixture[str]) -> None:
    # Mistral v0.1: the marker alone costs more than 8 tokens, so an 8-token first turn cannot be built.
    code = run_cli(
        [
            "--url",
            "http://127.0.0.1:1",
            "--isl",
            "8",
            "--cache-bust",
            "first_turn_prefix",
            "--concurrency",
            "1",
            "--request-count",
            "1",
        ]
    )
    assert code == 2
    assert "below the fixed cost" in capsys.readouterr().out


def test_cli_refuses_a_system_prompt_the_template_rejects(capsys: pytest.CaptureFixture[str]) -> None:
    code = run_cli(
        [
            "--url",
            "http://127.0.0.1:1",
            "--isl",
            "200",
            "--shared-system-prompt-length",
            "20",
            "--concurrency",
            "1",
            "--request-count",
            "1",
        ]
    )
    assert code == 2
    assert "template_error" in capsys.readouterr().out
