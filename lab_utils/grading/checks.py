"""Small helpers the question files share: number comparison, "wrong on k of n" verdicts, the test
that a measured answer is the object the run produced, and the plain-dict form of a model shape that
scenarios carry.

A hidden check states how many unseen cases were wrong, never which values it expected, so the
messages here carry counts only.
"""

from __future__ import annotations

import math
from typing import Any


def close(got: Any, want: float, rel: float = 1e-9, abs_tol: float = 1e-12) -> bool:
    """True when `got` is a number within `rel` of `want` (plus `abs_tol`); NaN matches only NaN.

    Anything that is not a number (None, a string, a list) is simply not close.
    """
    try:
        g, w = float(got), float(want)
    except (TypeError, ValueError):
        return False
    if math.isnan(w):
        return math.isnan(g)
    return math.isfinite(g) and abs(g - w) <= rel * abs(w) + abs_tol


def frac_wrong(n_wrong: int, n: int, what: str = "unseen cases") -> None:
    """Fail the whole check when any case was wrong, saying how many and nothing more."""
    assert not n_wrong, f"wrong on {n_wrong} of {n} {what}"


class Partly(float):
    """A fraction of the points that says what was wrong (`hint`): the property that failed, never
    an expected value. The feedback of a "partly right" shows it."""

    hint: str = ""


def partial(passed: int, total: int, what: str, failed: str = "") -> float | None:
    """Partial credit: None (full marks) when all passed, the passed fraction otherwise, and a failure
    when none passed. `failed` names the property the failing cases test ("a token that ends in half
    a character"), so a partly right answer knows what to look at; never their values."""
    why = f": {failed}" if failed else ""
    if passed == total:
        return None
    if passed == 0:
        raise AssertionError(f"wrong on all {total} unseen {what}{why}")
    out = Partly(passed / total)
    out.hint = f"right on {passed} of {total} unseen {what}{why}"
    return out


def inside(fn, *args, **kwargs):
    """`fn(*args, **kwargs)`, run where the learner's answers live.

    A check that hands a learner's function to course code that calls it back and mutates its own
    state (a scheduler step, a simulator's policy) uses this: under the grader, where the answers
    are proxies to a sandbox, `fn` (a course-library function, named by module and name) runs
    inside the sandbox and only its result comes back, as plain data. In the notebook, or when no
    argument is a proxy, it is a plain call.
    """
    for value in (*args, *kwargs.values()):
        run = getattr(type(value), "_lab_run_inside", None)
        if run is not None:
            return run(value, fn, args, kwargs)
    return fn(*args, **kwargs)


MODEL_FIELDS = (
    "name",
    "num_layers",
    "hidden_size",
    "num_attention_heads",
    "num_kv_heads",
    "head_dim",
    "intermediate_size",
    "vocab_size",
    "max_position_embeddings",
    "attention_bias",
)


def model_dict(spec: Any, *extra: str) -> dict:
    """A `lab_utils.memory.ModelSpec` as the JSON-able dict a scenario carries (plus `extra` fields)."""
    return {k: getattr(spec, k) for k in (*MODEL_FIELDS, *extra)}
