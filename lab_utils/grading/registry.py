"""Graded questions: an id, points, the answer names a check reads, and the check itself.

A lab's questions live in `lab_utils/grading/questions/labNN.py`:

    @question("02.allocate", points=2, answers=["allocate_blocks"])
    def _(allocate_blocks):
        assert [b.block_id for b in allocate_blocks(...)] == [0, 1], "block ids should ..."

A check gets the learner's answers by name, returns None (full points) or a fraction in [0, 1]
(partial credit), and raises AssertionError with a hint (never the answer) when it is wrong.
Checks must not trust the objects they receive: compare `int(x) == n`, `list(map(int, xs))`,
never `x == expected` on an object whose `__eq__` the learner wrote.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, field
from typing import Callable

_REGISTRY: dict[str, "Question"] = {}


@dataclass(frozen=True)
class Question:
    """One graded question."""

    id: str  # "<lab>.<name>", e.g. "00.num_layers"
    points: float
    answers: tuple[str, ...]  # names the check reads from the notebook's globals
    fn: Callable[..., float | None] = field(compare=False, repr=False)
    description: str = ""

    @property
    def lab(self) -> str:
        return self.id.split(".", 1)[0]


def question(qid: str, points: float, answers: list[str], description: str = ""):
    """Register a check function for question `qid` (decorator)."""
    if "." not in qid or not qid.split(".", 1)[0].isdigit():
        raise ValueError(f"question id {qid!r} must look like '02.name' (lab number, dot, name)")
    if points <= 0:
        raise ValueError(f"question {qid}: points must be positive, got {points}")
    if not answers:
        raise ValueError(f"question {qid}: name at least one answer variable")

    def register(fn: Callable[..., float | None]) -> Callable[..., float | None]:
        _REGISTRY[qid] = Question(qid, float(points), tuple(answers), fn,
                                  description or (fn.__doc__ or "").strip())
        return fn

    return register


def _load_all() -> None:
    from . import questions

    for info in pkgutil.iter_modules(questions.__path__):
        importlib.import_module(f"{questions.__name__}.{info.name}")


def get(qid: str) -> Question:
    """The registered question `qid`; a clear error for an unknown id."""
    _load_all()
    try:
        return _REGISTRY[qid]
    except KeyError:
        raise KeyError(f"unknown question id {qid!r}; known: {sorted(_REGISTRY)}") from None


def questions_for(lab: str) -> list[Question]:
    """All questions of a lab ("00", "01", ...), in id order."""
    _load_all()
    lab = str(lab).zfill(2)
    return sorted((q for q in _REGISTRY.values() if q.lab == lab), key=lambda q: q.id)


def all_questions() -> list[Question]:
    _load_all()
    return sorted(_REGISTRY.values(), key=lambda q: q.id)
