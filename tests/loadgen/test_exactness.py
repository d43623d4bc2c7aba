"""Every request of the grid lands exactly on its target, on every tokenizer family that accepts it."""

from __future__ import annotations

from typing import Any

import pytest

from tests.builders import TEMPLATES, build_tokenizer
from tests.conftest import FAMILIES, load_builtin, load_shared
from tests.lanes import sweep
from tests.loadgen.grid import run_grid

EXACT_RATE = 0.999


def check(tok: Any, rejects_system: bool = False) -> None:
    res = run_grid(tok)
    assert res.built >= 40
    assert res.rate >= EXACT_RATE, res.misses[:5]
    assert not res.misses, res.misses[:5]
    assert not res.identity_failures, res.identity_failures[:5]
    # Refusals are only ever for shapes the template cannot take: never ISL >= 128 without a system prompt.
    assert not [r for r in res.refused if r[0] >= 128 and r[3] == 0], res.refused
    if rejects_system:
        assert all(r[3] for r in res.refused if r[0] >= 128)


# A grid is seconds a tokenizer: the fast lane runs one built style and one shared family, the whole suite all.
@pytest.mark.parametrize("style", sweep(sorted(TEMPLATES), fast=sorted(TEMPLATES).index("inst")))
def test_built_tokenizers(style: str) -> None:
    check(build_tokenizer(style), rejects_system=style == "inst")


@pytest.mark.slow
def test_builtin_mistral() -> None:
    check(load_builtin().tokenizer, rejects_system=True)


@pytest.mark.parametrize(
    "shared_family",
    sweep(FAMILIES, ids=FAMILIES, fast=FAMILIES.index("smollm2-135m-instruct")),
    indirect=True,
)
def test_shared_family(shared_family: str) -> None:
    check(load_shared(shared_family).tokenizer)
