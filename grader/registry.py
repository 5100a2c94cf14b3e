"""The judge's registry: hidden checks by question id, and the key their cases are drawn from.

Question ids, points and answer names come from the course's question files
(`lab_utils.grading.questions`, imported here from the instructor's own copy, never from a
sandbox); the hidden checks and the references they compare with live only here, in `grader.hidden`,
which no sandbox can see.

A hidden check's cases come from `hidden_rng(key, student, lab, qid)`: an HMAC of the instructor's
secret with the student, the lab and the question. The notebook's SEED (`job_seed`) is a different
hash of the same secret, so nothing a notebook can see reproduces the hidden cases.
"""

from __future__ import annotations

import hashlib
import hmac
import importlib
import pkgutil
import random
from collections.abc import Callable

from lab_utils.grading.registry import Question, all_questions, get, questions_for

_HIDDEN: dict[str, Callable[..., float | None]] = {}

__all__ = ["Question", "all_questions", "get", "hidden", "hidden_check", "hidden_rng", "questions_for"]


def hidden(qid: str):
    """Register the hidden check of question `qid`: `fn(*answers, rng, scenario)` (decorator)."""

    def register(fn: Callable[..., float | None]) -> Callable[..., float | None]:
        _HIDDEN[qid] = fn
        return fn

    return register


def _load_all() -> None:
    from . import hidden as package

    for info in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"{package.__name__}.{info.name}")


def hidden_check(qid: str) -> Callable[..., float | None] | None:
    """The hidden check of question `qid`, or None."""
    _load_all()
    return _HIDDEN.get(qid)


def hidden_rng(key: int | str, student: str, lab: str, qid: str) -> random.Random:
    """The random source of one hidden check for one student (see the module docstring)."""
    mac = hmac.new(str(key).encode(), f"hidden/{student}/{lab}/{qid}".encode(), hashlib.sha256).digest()
    return random.Random(int.from_bytes(mac[:8], "big"))
