"""Fault switches of `islwatch emulate`, parsed from `--fault SPEC` strings. Pure: no I/O, no randomness.

Each switch reproduces a real way a server's prompt count drifts from the chat template, or a real failure:

- `double-bos`: the rendered prompt is encoded with special tokens again (vLLM's `add_special_tokens=true`
  on chat, or a server that re-tokenizes the rendered text), so a BOS-adding tokenizer gets BOS twice.
- `no-template`: the message texts are joined and encoded plainly, as a server without a chat template does.
- `system-prompt=N`: a hidden server-side system prompt of N tokens.
- `gen-prompt-off`: the template is rendered with `add_generation_prompt=False`.
- `status=CODE[@FRACTION]`: that fraction (default 1) of inference requests answer CODE with a JSON error.
- `latency=DURATION`: a sleep before the answer or the first stream chunk (`50ms`, `0.2s`, `1.5`).
- `token-latency=DURATION`: a sleep between stream chunks (makes chunked relay observable).
- `reset-mid-stream[@FRACTION]`: that fraction (default 1) of streams are cut after a few chunks.
- `tokenizer=SPEC`: prompts are counted, and `/tokenize` answered, with another tokenizer (SPEC as
  `--tokenizer` takes it: a folder, a hub id with `@REVISION`, `builtin:NAME`), as a server whose tokenizer
  files changed but whose chat template did not: the template stays the main tokenizer's. Everything after
  the first `=` is the spec (no `@FRACTION`: an `@` belongs to the revision).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass

KINDS = (
    "double-bos",
    "no-template",
    "system-prompt",
    "gen-prompt-off",
    "status",
    "latency",
    "token-latency",
    "reset-mid-stream",
    "tokenizer",
)
# Durations are bounded so a typo (`latency=50` meant as ms, read as s) is obvious but not a hung test.
MAX_SECONDS = 600.0
_DURATION = re.compile(r"^(?P<num>\d+(?:\.\d*)?|\.\d+)(?P<unit>ms|s)?$")


@dataclass(frozen=True)
class Faults:
    """All fault switches of one emulator. The default is a faithful vLLM-like server."""

    double_bos: bool = False
    no_template: bool = False
    system_prompt_tokens: int = 0
    gen_prompt_off: bool = False
    status: int | None = None
    status_rate: float = 0.0
    latency_seconds: float = 0.0
    token_latency_seconds: float = 0.0
    reset_rate: float = 0.0
    tokenizer: str | None = None  # `tokenizer=SPEC`: the encoder's spec (loaded by the app, not here)

    @property
    def changes_count(self) -> bool:
        """True when the reported prompt_tokens differ from the faithful vLLM count."""
        return (
            self.double_bos
            or self.no_template
            or self.system_prompt_tokens > 0
            or self.gen_prompt_off
            or self.tokenizer is not None
        )

    def describe(self) -> list[str]:
        """The specs back, normalized (for the startup log line and /health)."""
        out = []
        if self.double_bos:
            out.append("double-bos")
        if self.no_template:
            out.append("no-template")
        if self.system_prompt_tokens:
            out.append(f"system-prompt={self.system_prompt_tokens}")
        if self.gen_prompt_off:
            out.append("gen-prompt-off")
        if self.status is not None:
            out.append(f"status={self.status}@{self.status_rate:g}")
        if self.latency_seconds:
            out.append(f"latency={self.latency_seconds * 1000:g}ms")
        if self.token_latency_seconds:
            out.append(f"token-latency={self.token_latency_seconds * 1000:g}ms")
        if self.reset_rate:
            out.append(f"reset-mid-stream@{self.reset_rate:g}")
        if self.tokenizer is not None:
            out.append(f"tokenizer={self.tokenizer}")
        return out


def parse_duration(text: str) -> float:
    """`50ms`, `0.2s` or a bare number of seconds -> seconds."""
    m = _DURATION.match(text.strip())
    if not m:
        raise ValueError(f"bad duration {text!r}: expected e.g. 50ms, 0.2s or 1.5")
    value = float(m["num"]) / (1000.0 if m["unit"] == "ms" else 1.0)
    if value > MAX_SECONDS:
        raise ValueError(f"duration {text!r} is above {MAX_SECONDS:g}s")
    return value


def parse_rate(text: str, spec: str) -> float:
    try:
        rate = float(text)
    except ValueError:
        raise ValueError(f"fault {spec!r}: fraction {text!r} is not a number") from None
    if not math.isfinite(rate) or not 0.0 <= rate <= 1.0:
        raise ValueError(f"fault {spec!r}: fraction {text!r} is not between 0 and 1")
    return rate


def _split(spec: str) -> tuple[str, str | None, str | None]:
    """`name[=value][@fraction]` -> (name, value, fraction)."""
    head, at, rate = spec.partition("@")
    name, eq, value = head.partition("=")
    return name.strip().lower(), (value.strip() if eq else None), (rate.strip() if at else None)


def _require(cond: bool, spec: str, expected: str) -> None:
    if not cond:
        raise ValueError(f"bad fault {spec!r}: expected {expected}")


def parse_fault(spec: str) -> dict[str, object]:
    """One `--fault` spec -> the `Faults` fields it sets. Raises ValueError with a usable message."""
    name, value, rate = _split(spec)
    if name == "tokenizer":
        # The whole rest is the spec: `@` starts a revision there, not a fraction.
        tokenizer = spec.partition("=")[2].strip() if "=" in spec.partition("@")[0] else ""
        _require(bool(tokenizer), spec, "tokenizer=SPEC, e.g. tokenizer=builtin:mistral-v0.1 or a folder")
        return {"tokenizer": tokenizer}
    if name not in KINDS:
        raise ValueError(f"unknown fault {spec!r}; known: {', '.join(KINDS)}")
    if name in ("double-bos", "no-template", "gen-prompt-off"):
        _require(value is None and rate is None, spec, f"plain {name!r} without '=' or '@'")
        return {name.replace("-", "_"): True}
    if name == "system-prompt":
        _require(value is not None and value.isdigit() and rate is None, spec, "system-prompt=N (N tokens)")
        assert value is not None
        return {"system_prompt_tokens": int(value)}
    if name == "status":
        _require(value is not None and value.isdigit(), spec, "status=CODE[@FRACTION], e.g. status=503@0.1")
        assert value is not None
        code = int(value)
        _require(400 <= code <= 599, spec, "an HTTP error status between 400 and 599")
        return {"status": code, "status_rate": 1.0 if rate is None else parse_rate(rate, spec)}
    if name in ("latency", "token-latency"):
        _require(value is not None and rate is None, spec, f"{name}=DURATION, e.g. {name}=50ms")
        assert value is not None
        return {name.replace("-", "_") + "_seconds": parse_duration(value)}
    # reset-mid-stream
    _require(value is None, spec, "reset-mid-stream[@FRACTION], e.g. reset-mid-stream@0.1")
    return {"reset_rate": 1.0 if rate is None else parse_rate(rate, spec)}


def parse_faults(specs: Iterable[str]) -> Faults:
    """Every `--fault` spec -> one `Faults`. Giving the same switch twice is an error, not a silent override."""
    fields: dict[str, object] = {}
    seen: set[str] = set()
    for spec in specs:
        name = _split(spec)[0]
        if name in seen:
            raise ValueError(f"fault {name!r} given more than once")
        seen.add(name)
        fields.update(parse_fault(spec))
    return Faults(**fields)  # type: ignore[arg-type]
