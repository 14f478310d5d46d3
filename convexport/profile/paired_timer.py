"""Two models timed against each other in pairs, until the ratio is known to a target or a
budget is spent; and one model timed the same way, until its median is known.

Both sessions are alive and warmed. A *pair* is a block of runs of one model beside a block of
runs of the other, in alternating order (A then B, then B then A, ...), so that each pair sees
the same machine: a machine that slows down for a second slows both halves of the pairs made
meanwhile, and their ratios stay true. The pair's ratio is the median run of A's block over the
median run of B's. The speedup is the median of the pairs' ratios, and its 95% interval is the
distribution-free one of a median (the order statistics that a sign test puts around it:
`median_interval`), which asks nothing of the shape of the machine's noise (a loaded machine's
run times are bimodal, never normal).

Runs continue, pair after pair, until that interval is within `target` of the median on both
sides (at least MIN_PAIRS pairs), or the budget is spent: `budget_s` of timed runs (default
TIMED_BUDGET_S), but always MIN_PAIRS pairs, so a slow model takes the time its runs take.

A block whose runs are short (under SETTLE_BELOW_S) begins with one run that is not counted:
ONNX Runtime's worker threads spin for a while after a run, and one session's spinning threads
slow the other's next run (bench/RESULTS.md, "Measurements behind the code"). A block holds
enough runs to last about BLOCK_S (1 to MAX_BLOCK), so a pair of very short runs is not
dominated by the clock's own cost.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

TARGET = 0.02  # the interval's half-width the runs aim for, relative to the median
TIMED_BUDGET_S = 1.0
MIN_PAIRS = 6  # the fewest with a 95% interval of their median (their range: 97%)
MAX_PAIRS = 2000
SETTLE_BELOW_S = 0.05
BLOCK_S = 0.02
MAX_BLOCK = 10
CONFIDENCE = 0.95

Clock = Callable[[], float]


@dataclass
class PairedTiming:
    """What the pairs showed: `speedup` is the median of before/after over the pairs, inside
    [low, high] with CONFIDENCE; each model's counted runs in milliseconds."""

    speedup: float
    low: float
    high: float
    pairs: int
    block: int  # counted runs of each model in a pair
    stopped: str  # "interval": the target was reached; "budget": time ran out first; "runs": as many as asked
    timed_s: float
    runs_ms: dict[str, list[float]] = field(default_factory=dict)

    @property
    def half_width(self) -> float:
        """The interval's larger side, relative to the median: what the terminal shows as ±."""
        if self.speedup <= 0:
            return math.inf
        return max(self.speedup - self.low, self.high - self.speedup) / self.speedup

    def entry(self) -> dict:
        """The report's `paired`: speedup, low, high, pairs, stopped."""
        return {
            "speedup": self.speedup,
            "low": self.low,
            "high": self.high,
            "pairs": self.pairs,
            "stopped": self.stopped,
        }

    @property
    def verdict(self) -> str:
        """faster or slower where the whole interval says so, else no measurable change."""
        if self.low > 1:
            return "faster"
        if self.high < 1:
            return "slower"
        return "no measurable change"


@dataclass
class SingleTiming:
    """One model's counted runs (milliseconds), the median inside [low, high]."""

    median_ms: float
    low_ms: float
    high_ms: float
    runs_ms: list[float]
    stopped: str
    timed_s: float


def apart(before: SingleTiming, after: SingleTiming) -> dict:
    """The report's `paired` for two models timed one after the other, not in pairs: the ratio
    of their medians, its interval the ratio of their intervals (the widest it can be)."""
    return {
        "speedup": before.median_ms / after.median_ms,
        "low": before.low_ms / after.high_ms,
        "high": before.high_ms / after.low_ms,
        "pairs": 0,
        "stopped": "apart",
    }


def median_interval(values, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """A distribution-free interval of the median of `values`: [v(k), v(n+1-k)] of the sorted
    values, k the largest for which a Binomial(n, 1/2) falls below k with probability at most
    (1 - confidence) / 2. Fewer than six values have no 95% interval: their smallest and largest
    (the widest there is: 94% for five values, 50% for two)."""
    ordered = sorted(values)
    n = len(ordered)
    tail = (1 - confidence) / 2
    cumulative, k = 0.0, 0
    while k < n // 2:
        cumulative += math.comb(n, k) / 2**n  # P(B = k)
        if cumulative > tail:
            break
        k += 1
    if k == 0:
        return float(ordered[0]), float(ordered[-1])
    return float(ordered[k - 1]), float(ordered[n - k])


def block_size(settled_s: float) -> int:
    """Counted runs per block for runs of `settled_s` seconds (see the module doc)."""
    return int(min(MAX_BLOCK, max(1, math.ceil(BLOCK_S / max(settled_s, 1e-7)))))


def time_pair(
    runs: dict[str, Callable[[], object]],
    settled_s: float,
    target: float = TARGET,
    budget_s: float | None = None,
    progress: Callable[[int], None] | None = None,
    pairs: int | None = None,
    clock: Clock = time.perf_counter,
) -> PairedTiming:
    """The two models of `runs` (label -> a run; the first label is the one before) timed in
    pairs (module doc); `settled_s` is the slower one's settled run time, which sizes the
    blocks. `pairs` fixes their number instead. `progress(pairs)` is told after each pair."""
    (first, run_first), (second, run_second) = runs.items()
    block = block_size(settled_s)
    lead = settled_s < SETTLE_BELOW_S
    budget_s = TIMED_BUDGET_S if budget_s is None else budget_s
    samples: dict[str, list[float]] = {first: [], second: []}
    ratios: list[float] = []
    began = clock()
    stopped = ""
    while len(ratios) < (pairs or MAX_PAIRS):
        order = ((first, run_first), (second, run_second))
        medians = {}
        for label, run in order if len(ratios) % 2 == 0 else order[::-1]:
            times = _block(run, block, lead, clock)
            samples[label].extend(times)
            medians[label] = float(np.median(times))
        ratios.append(medians[first] / medians[second] if medians[second] > 0 else math.inf)
        if progress is not None:
            progress(len(ratios))
        if pairs is None and len(ratios) >= MIN_PAIRS:
            stopped = _stop(ratios, target, clock() - began >= budget_s)
            if stopped:
                break
    low, high = median_interval(ratios)
    stopped = "runs" if pairs else stopped or "budget"
    return PairedTiming(float(np.median(ratios)), low, high, len(ratios), block, stopped, clock() - began, samples)


def time_one(
    run: Callable[[], object],
    settled_s: float,
    target: float = TARGET,
    budget_s: float | None = None,
    least_runs: int = 0,
    fixed: int | None = None,
    clock: Clock = time.perf_counter,
) -> SingleTiming:
    """One model's runs, block after block, until the interval of their median is within
    `target` of it (at least MIN_PAIRS blocks and `least_runs` runs) or the budget is spent;
    exactly `fixed` runs where given."""
    block = block_size(settled_s)
    lead = settled_s < SETTLE_BELOW_S
    budget_s = TIMED_BUDGET_S if budget_s is None else budget_s
    samples: list[float] = []
    began = clock()
    stopped = ""
    while len(samples) < (fixed or MAX_PAIRS * block):
        samples.extend(_block(run, min(block, fixed - len(samples)) if fixed else block, lead, clock))
        if fixed is None and len(samples) >= max(least_runs, MIN_PAIRS * block):
            stopped = _stop(samples, target, clock() - began >= budget_s)
            if stopped:
                break
    low, high = median_interval(samples)
    stopped = "runs" if fixed else stopped or "budget"
    return SingleTiming(float(np.median(samples)), low, high, samples, stopped, clock() - began)


def _stop(values: list[float], target: float, spent: bool) -> str:
    """Why the runs stop now: "interval" (the median's interval within `target` of it),
    "budget" (`spent`), or "" (go on)."""
    low, high = median_interval(values)
    middle = float(np.median(values))
    if middle > 0 and max(middle - low, high - middle) <= target * middle:
        return "interval"
    return "budget" if spent else ""


def _block(run: Callable[[], object], size: int, lead: bool, clock: Clock) -> list[float]:
    """Milliseconds of `size` runs, after one run not counted where `lead`."""
    if lead:
        run()
    times = []
    for _ in range(size):
        start = clock()
        run()
        times.append((clock() - start) * 1e3)
    return times
