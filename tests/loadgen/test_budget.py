"""Pure budgeting: the search hits any reachable target and reports the ones it cannot reach."""

from __future__ import annotations

import pytest

from loadgen.workload.budget import fit_text, solve_overhead

WORDS = [f"w{i}" for i in range(500)]
FILLERS = ["f", "g"]


def linear(fixed: int):
    return lambda text: fixed + (len(text.split()) if text else 0)


@pytest.mark.parametrize("target", [7, 8, 50, 300])
def test_linear_measure_hits_exactly(target: int) -> None:
    fit = fit_text(linear(7), target, WORDS, FILLERS)
    assert fit.exact and fit.achieved == target == linear(7)(fit.text)


def test_target_below_fixed_cost_is_an_error() -> None:
    fit = fit_text(linear(10), 5, WORDS, FILLERS)
    assert not fit.exact
    assert "below the fixed cost 10" in (fit.error or "")


@pytest.mark.parametrize("target", [3, 4, 5, 101, 102])
def test_two_token_words_are_closed_with_fillers(target: int) -> None:
    # Every corpus word costs 2 tokens, fillers cost 1: odd targets need a filler at the end.
    def measure(text: str) -> int:
        return 3 + sum(1 if t in FILLERS else 2 for t in text.split())

    fit = fit_text(measure, target, WORDS, FILLERS)
    assert fit.exact, (target, fit)
    assert measure(fit.text) == target


@pytest.mark.parametrize("target", range(4, 200, 7))
def test_merging_boundary_is_handled(target: int) -> None:
    # Pairs of words merge into one token every 10 words: the count is not n + fixed, and not monotone steps.
    def measure(text: str) -> int:
        n = len(text.split()) if text else 0
        return 4 + n - n // 10

    fit = fit_text(measure, target, WORDS, FILLERS)
    assert fit.exact and measure(fit.text) == target


def test_unreachable_target_reports_closest() -> None:
    # Each word costs 3 and there is no one-token filler: most targets cannot be met.
    def measure(text: str) -> int:
        return 3 * (len(text.split()) if text else 0)

    fit = fit_text(measure, 10, WORDS, ["zz"])
    assert not fit.exact
    assert fit.achieved != 10 and "no exact text" in (fit.error or "")


def test_solve_overhead() -> None:
    # fixed 5, wrap 3: [user(S)] = 5 + 3 + b; [u, a, u] = 5 + 9 + 3b
    one = [(5 + 3 + b, b) for b in (10, 20, 30)]
    three = [(5 + 9 + 3 * b, 3 * b) for b in (10, 20, 30)]
    assert solve_overhead(one, three) == (5.0, 3.0)
