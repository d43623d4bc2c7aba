"""The fast lane's share of a sweep (`pytest -m fast`, tests/conftest.py): one value of a parametrized
sweep runs in it, the others are marked `slow` and run in the whole suite only. A developer still meets
every code path the sweep covers, on one tokenizer or one shape instead of all of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest


def sweep(
    values: Sequence[Any], ids: Sequence[str] | None = None, fast: int = 0, unpack: bool = False
) -> list[Any]:
    """`values` as pytest params (for `parametrize`, or a fixture's `params`): the one at index `fast` plain,
    the others marked slow. `unpack`: each value is a tuple of several argnames' values."""
    out = []
    for i, value in enumerate(values):
        args = tuple(value) if unpack else (value,)
        marks = () if i == fast else (pytest.mark.slow,)
        out.append(pytest.param(*args, id=None if ids is None else ids[i], marks=marks))
    return out
