"""Run one question's check on a set of answers and say what it earned and why."""

from __future__ import annotations

import traceback
from dataclasses import asdict, dataclass

from .registry import Question

NOT_ANSWERED = "not answered"
WRONG = "not yet right"
ERROR = "error"
CORRECT = "correct"
PARTIAL = "partly right"


@dataclass
class Result:
    """What one question earned."""

    id: str
    points: float
    earned: float
    status: str  # one of the constants above
    message: str = ""

    def to_dict(self) -> dict:
        return asdict(self)

    def _ipython_display_(self) -> None:
        # check() has already shown this result; a bare `check(...)` as a cell's last line
        # should not print the dataclass a second time
        pass


class _Missing(Exception):
    pass


def score(q: Question, namespace: dict) -> Result:
    """Score question `q` against the answers found in `namespace` (a notebook's globals)."""
    missing = [name for name in q.answers if name not in namespace]
    if missing:
        return Result(q.id, q.points, 0.0, NOT_ANSWERED,
                      f"define {', '.join(f'`{m}`' for m in missing)} and run its cell")
    try:
        fraction = q.fn(**{name: namespace[name] for name in q.answers})
    except NotImplementedError:
        return Result(q.id, q.points, 0.0, NOT_ANSWERED, "the answer still raises NotImplementedError")
    except AssertionError as exc:
        return Result(q.id, q.points, 0.0, WRONG, str(exc) or "the check's assertion failed")
    except Exception as exc:  # a learner's code may raise anything; report it, do not crash
        last = traceback.format_exception_only(type(exc), exc)[-1].strip()
        return Result(q.id, q.points, 0.0, ERROR, f"your answer raised {last}")
    if fraction is None:
        return Result(q.id, q.points, q.points, CORRECT, "")
    try:
        frac = float(fraction)
    except (TypeError, ValueError):
        return Result(q.id, q.points, 0.0, ERROR, "check returned a non-number (a bug in the check)")
    frac = min(1.0, max(0.0, frac))
    status = CORRECT if frac == 1.0 else (PARTIAL if frac > 0 else WRONG)
    return Result(q.id, q.points, round(q.points * frac, 4), status, "")
