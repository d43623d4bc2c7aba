"""Exact budgeting: choose how much corpus text goes into a slot so a measured count equals a target.

Pure: the caller passes `measure(text) -> int` (the templated count of the whole wire body with `text` in
the slot, or a bare count for a system prompt). Token counts are not additive (tokens merge across word
boundaries and template text), so we never trust an estimate: we measure, step by the error, bracket and
bisect when stepping oscillates, and finally close the last token or two with one-token fillers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

Measure = Callable[[str], int]
MAX_MEASURES = 64  # a failure budget; a normal fit takes 2-4 measurements


@dataclass(frozen=True)
class Fit:
    text: str
    achieved: int  # the measured count of the returned text
    measures: int
    error: str | None = None  # set when `achieved != target`

    @property
    def exact(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class Overhead:
    """Template cost around the content: `fixed` once per request, `wrap` per message, `marker` per marker."""

    fixed: float
    wrap: float
    marker: float


def solve_overhead(one: Sequence[tuple[int, int]], three: Sequence[tuple[int, int]]) -> tuple[float, float]:
    """(templated, bare) of [user(S)] and of [user(S), assistant(S), user(S)] per sample -> (fixed, wrap).

    one:   templated1 - bare = fixed + wrap
    three: templated3 - 3*bare = fixed + 3*wrap
    """
    fixed_sum = wrap_sum = 0.0
    for (t1, b1), (t3, b3) in zip(one, three, strict=True):
        a = t1 - b1
        c = t3 - b3
        wrap = (c - a) / 2
        fixed_sum += a - wrap
        wrap_sum += wrap
    n = max(len(one), 1)
    return fixed_sum / n, wrap_sum / n


class _Search:
    def __init__(self, measure: Measure, words: Sequence[str]) -> None:
        self.measure = measure
        self.words = words
        self.counts: dict[int, int] = {}
        self.calls = 0

    def text(self, n: int) -> str:
        return " ".join(self.words[:n])

    def count(self, n: int) -> int:
        if n not in self.counts:
            self.calls += 1
            self.counts[n] = self.measure(self.text(n))
        return self.counts[n]

    def raw(self, text: str) -> int:
        self.calls += 1
        return self.measure(text)


def fit_text(measure: Measure, target: int, words: Sequence[str], fillers: Sequence[str]) -> Fit:
    """Text of corpus words whose measured count equals `target`, or the closest miss with an error.

    `words` must be longer than the content budget (one-token words: len(words) >= target suffices).
    """
    s = _Search(measure, words)
    floor = s.count(0)
    if floor > target:
        return Fit(
            s.text(0), floor, s.calls, f"target {target} is below the fixed cost {floor} of the request"
        )
    top = len(words)
    n = min(target - floor, top)
    # Newton-style steps: each word costs about one token, so the error is about the step to take.
    while s.calls < 8:
        got = s.count(n)
        if got == target:
            return Fit(s.text(n), got, s.calls)
        nxt = min(max(n + target - got, 0), top)
        if nxt in s.counts:
            break
        n = nxt
    lo, hi = _bracket(s, target, top)
    if hi is None:
        return Fit(s.text(lo), s.count(lo), s.calls, f"corpus too short for target {target}")
    while hi - lo > 1:  # invariant: count(lo) < target < count(hi)
        mid = (lo + hi) // 2
        got = s.count(mid)
        if got == target:
            return Fit(s.text(mid), got, s.calls)
        lo, hi = (mid, hi) if got < target else (lo, mid)
    return _close_with_fillers(s, lo, target, fillers)


def _bracket(s: _Search, target: int, top: int) -> tuple[int, int | None]:
    below = [n for n, c in s.counts.items() if c < target]
    above = [n for n, c in s.counts.items() if c > target]
    lo = max(below) if below else 0
    step = 2
    while not above or min(above) <= lo:
        n = min(lo + step, top)
        c = s.count(n)
        if c > target:
            above.append(n)
        elif n == top:
            return lo, None
        else:
            lo = n if c < target else lo
        step *= 2
    return lo, min(n for n in above if n > lo)


def _close_with_fillers(s: _Search, lo: int, target: int, fillers: Sequence[str]) -> Fit:
    """count(lo) < target < count(lo + 1): the next word jumps by 2+. Append one-token fillers instead."""
    base = s.text(lo)
    current = s.count(lo)
    best = (base, current)
    while s.calls < MAX_MEASURES:
        advanced = False
        for f in fillers:
            if s.calls >= MAX_MEASURES:
                break
            cand = f"{base} {f}" if base else f
            got = s.raw(cand)
            if got == target:
                return Fit(cand, got, s.calls)
            if current < got < target:
                base, current, advanced = cand, got, True
                best = (cand, got)
                break
        if not advanced:
            break
    return Fit(best[0], best[1], s.calls, f"no exact text for target {target} (closest {best[1]})")
