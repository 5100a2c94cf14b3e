"""Graded questions, public checks, and the instructor's grader (`python -m lab_utils.grading`)."""

from .public import CHECK_MIME, check, recorded_results
from .registry import Question, all_questions, get, question, questions_for
from .scoring import Result, score

__all__ = ["CHECK_MIME", "Question", "Result", "all_questions", "check", "get", "question",
           "questions_for", "recorded_results", "score"]
