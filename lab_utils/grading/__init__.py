"""Graded questions, public checks, and the instructor's grader (`python -m lab_utils.grading`)."""

from .public import CHECK_MIME, check, recorded_results
from .registry import Question, all_questions, get, hidden, lab_scenario, question, questions_for, scenario
from .scoring import Result, score, score_graded

__all__ = [
    "CHECK_MIME",
    "Question",
    "Result",
    "all_questions",
    "check",
    "get",
    "hidden",
    "lab_scenario",
    "question",
    "questions_for",
    "recorded_results",
    "scenario",
    "score",
    "score_graded",
]
