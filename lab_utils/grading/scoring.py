"""Run one question's checks on a set of answers and say what it earned and why.

`score` runs the public check (what `check()` shows in the notebook), in the notebook's own process.
It refuses answers that are None or that are, or call, a reference implementation the question
forbids. What the grader records is computed by the instructor's judge (`grader.judge`), with the
learner's code in a sandbox.
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback
from dataclasses import asdict, dataclass

from .registry import Question

NOT_ANSWERED = "not answered"
WRONG = "not yet right"
ERROR = "error"
CORRECT = "correct"
PARTIAL = "partly right"
REFERENCE = "uses the reference"


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


class UsesReference(Exception):
    """An answer is, or calls, a reference implementation the question forbids."""


# --- forbidden references ----------------------------------------------------------------------


def _resolve(spec: str):
    module, _, attr = spec.partition(":")
    obj = importlib.import_module(module)
    for part in attr.split(".") if attr else []:
        obj = getattr(obj, part)
    return obj


def _code_objects(obj) -> set:
    """Code objects of a function, or of every function defined on a class and its bases."""
    codes = set()
    if isinstance(obj, type):
        for klass in obj.__mro__:
            if klass is object:
                continue
            for value in vars(klass).values():
                for f in (value, getattr(value, "__func__", None), getattr(value, "fget", None)):
                    code = getattr(f, "__code__", None)
                    if code is not None:
                        codes.add(code)
    else:
        obj = getattr(obj, "fget", None) or obj  # a property (ModelSpec.num_params): its getter
        code = getattr(obj, "__code__", None) or getattr(getattr(obj, "__func__", None), "__code__", None)
        if code is None:  # numpy's array-function dispatchers (np.percentile) keep the function aside
            code = getattr(getattr(obj, "_implementation", None), "__code__", None)
        if code is not None:
            codes.add(code)
    return codes


_LIB = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # .../lab_utils
_SYSTEM = tuple({sys.prefix, sys.base_prefix, sys.exec_prefix})
# the instructor's hidden checks, when the course's own tests run them in-process (grader.judge)
_HIDDEN_DIR = os.sep + os.path.join("grader", "hidden") + os.sep


def _is_learner_code(code) -> bool:
    path = code.co_filename
    if path.startswith("<frozen") or path.startswith(_SYSTEM) and "site-packages" in path:
        return False
    if os.path.abspath(path).startswith(_LIB + os.sep):
        return False
    return not any(path.startswith(os.path.join(p, "lib")) for p in _SYSTEM)


def _forbidden(q: Question) -> list:
    found = []
    for spec in q.forbid:
        try:
            found.append((spec, _resolve(spec)))
        except Exception as exc:  # a check author's typo must not pass every learner
            raise RuntimeError(f"question {q.id}: cannot import forbidden reference {spec!r}: {exc}") from exc
    return found


def _check_identity(q: Question, values: dict, forbidden: list) -> None:
    for name, value in values.items():
        inner = getattr(value, "func", None)  # functools.partial
        for spec, ref in forbidden:
            same = value is ref or inner is ref
            if not same and isinstance(value, type) and isinstance(ref, type):
                same = issubclass(value, ref)
            if (
                not same
                and callable(value)
                and _code_objects(value)
                and _code_objects(value) == _code_objects(ref)
            ):
                same = True
            if same:
                from .forbidden import refusal

                raise UsesReference(f"`{name}`: {refusal(spec)}")


class _CallWatch:
    """A profile hook that notices learner code calling a forbidden reference."""

    def __init__(self, forbidden: list):
        self.codes = {}
        for spec, ref in forbidden:
            for code in _code_objects(ref):
                self.codes[code] = spec
        self.hit: str | None = None

    def __call__(self, frame, event, arg):
        if event == "call" and self.hit is None and frame.f_code in self.codes:
            caller = frame.f_back
            while caller is not None:
                name = caller.f_code.co_filename
                if "grading" in name and "questions" in name or _HIDDEN_DIR in name:
                    return  # the check itself computing the reference
                if _is_learner_code(caller.f_code):
                    self.hit = self.codes[frame.f_code]
                    return
                caller = caller.f_back

    def __enter__(self):
        if self.codes:
            self._old = sys.getprofile()
            sys.setprofile(self)
        return self

    def __exit__(self, *exc):
        if self.codes:
            sys.setprofile(self._old)
        return False


# --- running a check ---------------------------------------------------------------------------


def _run(q: Question, fn, values: dict, extra: dict, forbidden: list) -> tuple[float | None, str, str]:
    """Run one check function: (fraction or None on failure, status, message)."""
    watch = _CallWatch(forbidden)
    try:
        with watch:
            fraction = fn(**values, **extra)
    except NotImplementedError:
        return None, NOT_ANSWERED, "the answer still raises NotImplementedError"
    except AssertionError as exc:
        if watch.hit:
            return _calls_reference(watch.hit)
        return None, WRONG, str(exc) or "the check's assertion failed"
    except Exception as exc:  # a learner's code may raise anything; report it, do not crash
        if watch.hit:  # it called a reference first (the sandbox's stand-in would have refused)
            return _calls_reference(watch.hit)
        last = traceback.format_exception_only(type(exc), exc)[-1].strip()
        return None, ERROR, f"your answer raised {last}"
    if watch.hit:
        return _calls_reference(watch.hit)
    return check_fraction(fraction)


def _calls_reference(hit: str) -> tuple[None, str, str]:
    """The result of an answer that called the forbidden reference `hit` ("module:attr")."""
    from .forbidden import refusal

    return None, REFERENCE, refusal(hit)


def check_fraction(fraction) -> tuple[float | None, str, str]:
    """What a check returned (None: full marks, else a fraction) as (fraction, status, message)."""
    if fraction is None:
        return 1.0, CORRECT, ""
    try:
        frac = float(fraction)
    except (TypeError, ValueError):
        return None, ERROR, "check returned a non-number (a bug in the check)"
    return min(1.0, max(0.0, frac)), "", str(getattr(fraction, "hint", "") or "")[:300]


def result_for(q: Question, frac: float, message: str = "") -> Result:
    """The Result of question `q` for a fraction of its points (`message`: what a partly right answer
    got wrong)."""
    status = CORRECT if frac == 1.0 else (PARTIAL if frac > 0 else WRONG)
    return Result(q.id, q.points, round(q.points * frac, 4), status, message if status == PARTIAL else "")


def _prepare(q: Question, namespace: dict) -> tuple[dict | None, Result | None, list]:
    missing = [name for name in q.answers if name not in namespace]
    if missing:
        return (
            None,
            Result(
                q.id,
                q.points,
                0.0,
                NOT_ANSWERED,
                f"define {', '.join(f'`{m}`' for m in missing)} and run its cell",
            ),
            [],
        )
    values = {name: namespace[name] for name in q.answers}
    nones = [n for n, v in values.items() if v is None and n not in q.allow_none]
    if nones:
        return (
            None,
            Result(
                q.id, q.points, 0.0, NOT_ANSWERED, f"{', '.join(f'`{n}`' for n in nones)} is None: compute it"
            ),
            [],
        )
    forbidden = _forbidden(q)
    try:
        _check_identity(q, values, forbidden)
    except UsesReference as exc:
        return None, Result(q.id, q.points, 0.0, REFERENCE, str(exc)), []
    return values, None, forbidden


_result = result_for


def score(q: Question, namespace: dict) -> Result:
    """Score the public check of question `q` against the answers in `namespace` (a notebook's globals)."""
    values, early, forbidden = _prepare(q, namespace)
    if early:
        return early
    frac, status, message = _run(q, q.fn, values, {}, forbidden)
    if frac is None:
        return Result(q.id, q.points, 0.0, status, message)
    return _result(q, frac, message)
