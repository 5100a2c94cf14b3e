"""Seeded interview drills: back-of-the-envelope serving questions with worked answers.

    drills = make_drills(seed=3, topics=["kv_cache", "speculative"], n=10)
    d = drills[0]
    print(d.question); d.is_correct(42.0); print(d.explanation)

The same seed always gives the same drills; another seed gives other instances (other models,
GPUs, lengths, rates, acceptance rates), so the answers cannot be memorised. Every drill states
all its numbers in `question` and again in `inputs`, so code can answer it. Topics: see TOPICS.
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass, field

from .topics import GENERATORS

TOPICS: tuple[str, ...] = tuple(GENERATORS)


@dataclass(frozen=True)
class Drill:
    """One numeric question with its reference answer and a worked explanation."""

    id: str  # "<seed>-<index>", stable for a seed
    topic: str  # one of TOPICS
    kind: str  # the calculation asked for (a topic has one or two)
    question: str
    answer: float  # the reference answer, in `unit`
    unit: str
    tolerance: float  # relative: |given - answer| <= tolerance x |answer| counts as right
    explanation: str  # the worked answer, shown after the learner answers
    inputs: dict = field(default_factory=dict)  # every number the question states

    def is_correct(self, value: float | None) -> bool:
        """Whether `value` is within the relative tolerance of the reference answer."""
        try:
            v = float(value)
        except (TypeError, ValueError):
            return False
        return math.isfinite(v) and abs(v - self.answer) <= self.tolerance * abs(self.answer) + 1e-12

    def to_dict(self) -> dict:
        return asdict(self)


def make_drills(seed: int, topics: list[str] | None = None, n: int = 20) -> list[Drill]:
    """`n` drills drawn from `topics` (all when None), every topic before any repeats, in a seeded order."""
    chosen = list(TOPICS if topics is None else topics)
    unknown = [t for t in chosen if t not in GENERATORS]
    if unknown or not chosen:
        raise ValueError(f"unknown topics {unknown}; choose from {list(TOPICS)}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive whole number of drills, got {n!r}")
    rng = random.Random(f"lab_utils.drills:{int(seed)}")
    order: list[str] = []
    while len(order) < n:
        block = list(chosen)
        rng.shuffle(block)
        order += block
    drills = []
    for i, topic in enumerate(order[:n]):
        s = GENERATORS[topic](random.Random(f"{int(seed)}:{i}:{topic}"))
        drills.append(
            Drill(
                f"{int(seed)}-{i:02d}",
                topic,
                s.kind,
                s.question,
                float(s.answer),
                s.unit,
                s.tolerance,
                s.explanation,
                dict(s.inputs),
            )
        )
    return drills


__all__ = ["TOPICS", "Drill", "make_drills"]
