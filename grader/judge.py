"""The judge: scores a lab's questions by calling the learner's answers inside a sandbox.

For each question the judge starts one runner (remote.py) inside the sandbox, with that question's
forbidden references replaced there, and runs the public check and then the hidden check here, in
its own process, with the learner's answers as proxies. Every value the learner's code produces
reaches the judge as plain data; the references and the hidden cases never enter the sandbox.
The score is the public fraction times the hidden fraction, as in the notebook's `check()`, whose
statuses and messages it shares (lab_utils.grading.scoring).

A question whose runner dies, hangs, floods or breaks the protocol scores zero with the reason; the
other questions are unaffected.
"""

from __future__ import annotations

import dataclasses
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from lab_utils.grading.forbidden import refusal
from lab_utils.grading.sandboxed import TAMPER
from lab_utils.grading.scoring import (
    ERROR,
    NOT_ANSWERED,
    REFERENCE,
    WRONG,
    Result,
    check_fraction,
    result_for,
    score,
)

from .library import HIDDEN_LABEL, fingerprints, library_for
from .registry import Question, hidden_check, hidden_rng, questions_for
from .remote import LearnerError, Runner, RunnerFailed, UsesReference
from .sandbox import Sandbox


@dataclass
class Context:
    """Everything the judge needs to score one student's lab."""

    answers_dir: Path
    work: Path  # the judge's own scratch folder (runner logs); never inside a sandbox
    student: str
    key: int | str  # the instructor's secret (hidden cases)
    scenario: dict  # the scenario the notebook ran with (value answers are computed from it)
    sandbox: Callable[[], Sandbox | None]  # a fresh sandbox description per runner; None: unsandboxed
    python: str
    env: dict
    per_question: float = 120.0
    memory_mb: int = 4096
    statuses: dict[str, str] = field(default_factory=dict)
    budget_s: float | None = None  # the whole submission's judge time; None: judge_budget(questions)


def refused(spec: str) -> str:
    """The feedback for an answer the runner refused: what it used, named as what it is (never a
    hidden reference's name)."""
    if spec == HIDDEN_LABEL:
        return "your answer runs a copy of the grader's own reference; write your own"
    if spec == TAMPER:
        return "your answer turned off the grader's call watch (sys.setprofile, or a thread started outside threading)"
    return refusal(spec)


def _run(fn, values: dict, extra: dict) -> tuple[float | None, str, str]:
    """Run one check: (fraction or None on failure, status, message)."""
    try:
        fraction = fn(**values, **extra)
    except UsesReference as exc:
        return None, REFERENCE, refused(str(exc))
    except RunnerFailed as exc:
        return None, ERROR, str(exc)
    except NotImplementedError:
        return None, NOT_ANSWERED, "the answer still raises NotImplementedError"
    except AssertionError as exc:
        if getattr(exc, "from_learner", False):  # raised by the answer, not by the check
            return None, ERROR, f"your answer raised AssertionError: {exc}"[:300]
        return None, WRONG, str(exc) or "the check's assertion failed"
    except LearnerError as exc:
        return None, ERROR, f"your answer raised {exc}"[:300]
    except Exception as exc:
        last = traceback.format_exception_only(type(exc), exc)[-1].strip()
        if getattr(exc, "from_learner", False):
            return None, ERROR, f"your answer raised {last}"[:300]
        # raised by the check itself, on what the answer returned (or a fault in the check)
        return None, ERROR, f"{CHECK_FAILED}{last}"[:300]
    return check_fraction(fraction)


def judge_question(q: Question, ctx: Context) -> Result:
    """Score one question: public check, then hidden check, against a fresh sandboxed runner."""
    log = ctx.work / f"runner-{q.id}.log"
    try:
        runner = Runner(
            ctx.answers_dir,
            list(q.forbid),
            ctx.sandbox(),
            ctx.python,
            ctx.env,
            log,
            timeout=ctx.per_question,
            memory_mb=ctx.memory_mb,
            library=library_for(q.forbid),
            prints=fingerprints(q),
        )
    except RunnerFailed as exc:
        return Result(q.id, q.points, 0.0, ERROR, str(exc))
    try:
        values = {}
        for name in q.answers:
            try:
                value = runner.answer(name)
            except LookupError as exc:
                return Result(q.id, q.points, 0.0, NOT_ANSWERED, str(exc)[:300])
            except UsesReference as exc:
                return Result(q.id, q.points, 0.0, REFERENCE, f"`{name}`: {refused(str(exc))}")
            except RunnerFailed as exc:
                return Result(q.id, q.points, 0.0, ERROR, str(exc))
            except Exception as exc:
                return Result(q.id, q.points, 0.0, ERROR, f"`{name}` could not be read: {exc}"[:300])
            if value is None and name not in q.allow_none:
                return Result(q.id, q.points, 0.0, NOT_ANSWERED, f"`{name}` is None: compute it")
            values[name] = value
        public, status, message = _run(q.fn, values, {})
        if public is None:
            return Result(q.id, q.points, 0.0, status, message)
        check = hidden_check(q.id)
        if check is None or public == 0:
            return result_for(q, public)
        extra = {"rng": hidden_rng(ctx.key, ctx.student, q.lab, q.id), "scenario": dict(ctx.scenario)}
        frac, status, message = _run(check, values, extra)
        if frac is None:
            if status == WRONG:
                message = f"passes the public check but not the grader's unseen cases: {message}"
            elif status == ERROR and message.startswith("your answer raised "):
                message = _type_only(message)
            elif status == ERROR and message.startswith(CHECK_FAILED):
                message = _check_failed(message)
            return Result(q.id, q.points, 0.0, status, message)
        return result_for(q, round(public * frac, 6), message)
    finally:
        runner.close()


CHECK_FAILED = "the check could not use what your answer returned: "


def _check_failed(message: str) -> str:
    """The check's own exception on a hidden case, cut to its type (its text may quote the case)."""
    kind = _exception_kind(message[len(CHECK_FAILED) :])
    return (
        f"the check could not use what your answer returned on one of the grader's unseen cases ({kind}): "
        "return the type and shape the question asks for; if you do, this is a fault in the course, "
        "tell your instructor"
    )


def _type_only(message: str) -> str:
    """An exception the answer raised on a hidden case, cut to its type: its text is the learner's
    own choice and may carry the hidden inputs out into the feedback."""
    kind = _exception_kind(message[len("your answer raised ") :])
    return f"your answer raised {kind} on one of the grader's unseen cases (its message is not shown)"


def _exception_kind(text: str) -> str:
    """'ValueError: anything' -> 'ValueError': the exception's type name, nothing of its message."""
    words = text.split(":", 1)[0].split()
    kind = words[0] if words else ""
    return "".join(ch for ch in kind if ch.isalnum() or ch in "._")[:60] or "an exception"


JUDGE_S_PER_QUESTION = 40.0  # the judge's budget for one submission, per question (README: "Limits")


def judge_budget(questions: int, per_question: float = JUDGE_S_PER_QUESTION) -> float:
    """Seconds the judge may spend on one submission of a lab with `questions` questions: the
    per-question allowance for each, and one and a half more for starting up."""
    return per_question * (questions + 1.5)


def judge_lab(lab: str, ctx: Context) -> list[Result]:
    """Score every question of `lab` within one budget for the whole submission: each question's
    runner gets what is left (at most `ctx.per_question`); once it is spent, the questions not yet
    judged score 0 with a status that says so."""
    qs = questions_for(lab)
    budget = ctx.budget_s if ctx.budget_s is not None else judge_budget(len(qs))
    deadline = time.monotonic() + budget
    results = []
    for q in qs:
        left = deadline - time.monotonic()
        if left < 1.0:
            results.append(
                Result(
                    q.id,
                    q.points,
                    0.0,
                    ERROR,
                    f"not judged: this submission used the judge's whole budget ({budget:.0f} s for "
                    f"{len(qs)} questions) on the questions before it; make slow answers faster",
                )
            )
            continue
        results.append(judge_question(q, dataclasses.replace(ctx, per_question=min(ctx.per_question, left))))
    return results


def score_in_process(q: Question, namespace: dict, seed: int) -> Result:
    """Public then hidden check run here, on answers in this process (no sandbox): for the course's
    own tests of its checks with trusted implementations, never for a learner's submission.

    Hidden cases come from `seed` (as the scenario does), so a test can reproduce them."""
    from lab_utils.grading.registry import lab_scenario, seeded_rng
    from lab_utils.grading.scoring import _prepare
    from lab_utils.grading.scoring import _run as run_watched

    public = score(q, namespace)
    check = hidden_check(q.id)
    if public.earned == 0 or check is None:
        return public
    values, early, forbidden = _prepare(q, namespace)
    try:
        scen = lab_scenario(q.lab, seed)
    except KeyError:
        scen = {}
    extra = {"rng": seeded_rng(seed, f"hidden/{q.id}"), "scenario": scen}
    frac, status, message = run_watched(q, check, values, extra, forbidden)
    if frac is None:
        if status == WRONG:
            message = f"passes the public check but not the grader's unseen cases: {message}"
        return Result(q.id, q.points, 0.0, status, message)
    public_frac = public.earned / q.points if q.points else 0.0
    return result_for(q, round(public_frac * frac, 6), message)


score_graded = score_in_process  # the name the course's tests know
