"""Ship or hold: an accuracy gate that decides from paired measurements and their uncertainty.

A candidate (a quantized KV cache, quantized weights) is measured on the same prompts as the
baseline. The gate ships it only when a confidence interval rules out a loss larger than the
stated tolerance; when the interval still reaches past the tolerance, it holds, even if the point
estimate looks fine. A small sample therefore holds more often: it cannot tell a harmless
candidate from a harmful one, and the interval says so.

    gate_agreement([True] * 58 + [False] * 2, min_rate=0.9)      # exact binomial (Clopper-Pearson)
    gate_paired(baseline_nll, candidate_nll, tolerance=0.02, higher_is_better=False)  # bootstrap

Both return a `GateDecision`: the decision, the estimate, the interval, and a one-line reason.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["GateDecision", "clopper_pearson", "gate_agreement", "gate_paired", "paired_bootstrap"]


@dataclass(frozen=True)
class GateDecision:
    """What the gate decided and why."""

    decision: str  # "ship" or "hold"
    estimate: float  # the point estimate (agreement rate, or mean candidate - baseline)
    low: float  # the confidence interval around it
    high: float
    threshold: float  # the interval must clear this bound to ship
    confidence: float
    n: int  # paired measurements
    method: str  # "clopper-pearson" or "paired bootstrap"
    point_decision: str  # what the point estimate alone would have decided
    higher_is_better: bool = True  # then the interval's lower end must clear the threshold

    @property
    def reason(self) -> str:
        """One line: the decision, the estimate, the interval and the end that decided."""
        side, bound = ("lower", self.low) if self.higher_is_better else ("upper", self.high)
        verdict = "clears" if self.decision == "ship" else "does not clear"
        return (
            f"{self.decision}: estimate {self.estimate:.4g}, {self.confidence:.0%} interval "
            f"[{self.low:.4g}, {self.high:.4g}] from {self.n} pairs ({self.method}); its {side} end "
            f"{bound:.4g} {verdict} the bound {self.threshold:.4g}"
        )

    def as_row(self) -> dict:
        return {
            "decision": self.decision,
            "point estimate alone": self.point_decision,
            "estimate": round(self.estimate, 4),
            "interval": (round(self.low, 4), round(self.high, 4)),
            "must clear": round(self.threshold, 4),
            "n": self.n,
            "method": self.method,
        }


def _check_confidence(confidence: float) -> None:
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be between 0 and 1 (0.95 for 95%), got {confidence!r}")


def _binomial_tail_ge(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p), summed in log space (no overflow for large n)."""
    if k <= 0:
        return 1.0
    if p <= 0:
        return 0.0
    if p >= 1:
        return 1.0
    lp, lq = math.log(p), math.log1p(-p)
    logs = [math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * lp + (n - i) * lq
            for i in range(k, n + 1)]  # fmt: skip
    top = max(logs)
    return min(1.0, math.exp(top) * sum(math.exp(x - top) for x in logs))


def _solve(f, target: float) -> float:
    """The p in [0, 1] where the increasing function f(p) reaches target (bisection)."""
    lo, hi = 0.0, 1.0
    for _ in range(80):
        mid = (lo + hi) / 2
        if f(mid) < target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def clopper_pearson(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """The exact (Clopper-Pearson) two-sided interval for a rate seen k times in n trials.

    It inverts the binomial test: the lower end is the p at which seeing k or more has
    probability (1 - confidence) / 2, the upper end the p at which seeing k or fewer has.
    """
    if isinstance(k, bool) or isinstance(n, bool) or int(k) != k or int(n) != n or not 0 <= k <= n or n < 1:
        raise ValueError(f"need whole numbers 0 <= k <= n and n >= 1, got k={k!r}, n={n!r}")
    _check_confidence(confidence)
    k, n = int(k), int(n)
    alpha = 1 - confidence
    low = 0.0 if k == 0 else _solve(lambda p: _binomial_tail_ge(k, n, p), alpha / 2)
    # P(X <= k) = 1 - P(X >= k + 1) falls as p grows: solve 1 - that = 1 - alpha / 2.
    high = 1.0 if k == n else _solve(lambda p: _binomial_tail_ge(k + 1, n, p), 1 - alpha / 2)
    return low, high


def gate_agreement(matches: Sequence[bool], min_rate: float, confidence: float = 0.95) -> GateDecision:
    """Ship when the candidate agrees with the baseline on at least `min_rate` of prompts, surely.

    Args:
        matches: one entry per prompt, True where the candidate's output equals the baseline's.
        min_rate: the agreement the candidate must keep (the tolerance is 1 - min_rate).
        confidence: of the exact binomial interval.
    Returns:
        "ship" when the interval's lower end is at least min_rate, else "hold".
    """
    if not 0 <= min_rate <= 1:
        raise ValueError(f"min_rate is a share between 0 and 1, got {min_rate!r}")
    n, k = len(matches), sum(bool(m) for m in matches)
    if n == 0:
        raise ValueError("no paired measurements: the gate needs at least one prompt")
    low, high = clopper_pearson(k, n, confidence)
    rate = k / n
    return GateDecision(
        decision="ship" if low >= min_rate else "hold",
        estimate=rate,
        low=low,
        high=high,
        threshold=min_rate,
        confidence=confidence,
        n=n,
        method="clopper-pearson",
        point_decision="ship" if rate >= min_rate else "hold",
    )


def paired_bootstrap(
    baseline: Sequence[float],
    candidate: Sequence[float],
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> tuple[float, float, float]:
    """Mean of candidate - baseline over the pairs, and its percentile bootstrap interval.

    Pairs are resampled together (the same prompts for both), so what varies from prompt to prompt
    cancels and only the difference the candidate makes is left.
    """
    if len(baseline) != len(candidate):
        raise ValueError(
            f"paired measurements need one candidate value per baseline value, got "
            f"{len(baseline)} and {len(candidate)}"
        )
    if not baseline:
        raise ValueError("no paired measurements")
    _check_confidence(confidence)
    diffs = [float(c) - float(b) for b, c in zip(baseline, candidate)]
    n = len(diffs)
    rng = random.Random(seed)
    means = sorted(sum(diffs[rng.randrange(n)] for _ in range(n)) / n for _ in range(int(resamples)))
    alpha = 1 - confidence
    lo_i = max(0, math.floor(alpha / 2 * len(means)))
    hi_i = min(len(means) - 1, math.ceil((1 - alpha / 2) * len(means)) - 1)
    return sum(diffs) / n, means[lo_i], means[hi_i]


def gate_paired(
    baseline: Sequence[float],
    candidate: Sequence[float],
    tolerance: float,
    higher_is_better: bool = True,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> GateDecision:
    """Ship when the candidate's mean loss against the baseline is surely within `tolerance`.

    Args:
        baseline, candidate: one number per prompt, measured on the same prompts (a score, a
            per-prompt accuracy, a negative log-likelihood).
        tolerance: the largest loss accepted, in the metric's units (>= 0).
        higher_is_better: True for scores and accuracies, False for losses such as NLL.
    Returns:
        "ship" when the whole bootstrap interval of (candidate - baseline) stays on the right side
        of -tolerance (or +tolerance when lower is better), else "hold".
    """
    if not tolerance >= 0:
        raise ValueError(f"tolerance is the largest acceptable loss, >= 0; got {tolerance!r}")
    mean, low, high = paired_bootstrap(baseline, candidate, confidence, resamples, seed)
    if higher_is_better:
        threshold, ok, point_ok = -tolerance, low >= -tolerance, mean >= -tolerance
    else:
        threshold, ok, point_ok = tolerance, high <= tolerance, mean <= tolerance
    return GateDecision(
        decision="ship" if ok else "hold",
        estimate=mean,
        low=low,
        high=high,
        threshold=threshold,
        confidence=confidence,
        n=len(baseline),
        method="paired bootstrap",
        point_decision="ship" if point_ok else "hold",
        higher_is_better=higher_is_better,
    )
