"""`--fault SPEC` parsing (pure): every switch, the default fractions, round trips and clear errors."""

from __future__ import annotations

import pytest

from proxy.emulator.faults import Faults, parse_duration, parse_faults

EVERY_SPEC = [
    "double-bos",
    "no-template",
    "system-prompt=7",
    "gen-prompt-off",
    "status=503@0.1",
    "latency=50ms",
    "token-latency=0.002s",
    "reset-mid-stream@0.25",
]


def test_every_fault_spec_parses() -> None:
    assert parse_faults(EVERY_SPEC) == Faults(
        double_bos=True,
        no_template=True,
        system_prompt_tokens=7,
        gen_prompt_off=True,
        status=503,
        status_rate=0.1,
        latency_seconds=0.05,
        token_latency_seconds=0.002,
        reset_rate=0.25,
    )


@pytest.mark.parametrize(
    ("spec", "field"), [("status=429", "status_rate"), ("reset-mid-stream", "reset_rate")]
)
def test_fraction_defaults_to_every_request(spec: str, field: str) -> None:
    assert getattr(parse_faults([spec]), field) == 1.0


def test_no_faults_is_a_faithful_server() -> None:
    assert parse_faults([]) == Faults() and not Faults().changes_count


def test_bare_duration_is_seconds() -> None:
    assert parse_duration("1.5") == 1.5


def test_describe_round_trips() -> None:
    faults = parse_faults(EVERY_SPEC)
    assert parse_faults(faults.describe()) == faults


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("bogus", "unknown fault"),
        ("system-prompt=x", "system-prompt=N"),
        ("system-prompt", "system-prompt=N"),
        ("double-bos=1", "plain"),
        ("status=200@0.1", "between 400 and 599"),
        ("status=503@1.5", "between 0 and 1"),
        ("status=503@nan", "between 0 and 1"),
        ("latency=fast", "bad duration"),
        ("latency=5h", "bad duration"),
        ("latency=9999s", "above"),
        ("reset-mid-stream=3", "reset-mid-stream[@FRACTION]"),
    ],
)
def test_bad_fault_specs_are_clear_errors(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[")):
        parse_faults([spec])


def test_repeated_fault_is_an_error() -> None:
    with pytest.raises(ValueError, match="more than once"):
        parse_faults(["latency=1ms", "latency=2ms"])
