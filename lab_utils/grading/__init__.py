"""The learner's side of grading: questions, scenarios and public checks (`check()`).

The instructor's side (hidden checks, references, the judge, the sandbox, the gradebook and the
command line) is the top-level `grader` package, which nothing here imports.
"""

from .public import CHECK_MIME, check, recorded_results
from .registry import (
    Question,
    all_questions,
    get,
    lab_limits,
    lab_scenario,
    question,
    questions_for,
    scenario,
)
from .scoring import Result, score

__all__ = [
    "CHECK_MIME",
    "Question",
    "Result",
    "all_questions",
    "check",
    "get",
    "lab_limits",
    "lab_scenario",
    "question",
    "questions_for",
    "recorded_results",
    "scenario",
    "score",
]
