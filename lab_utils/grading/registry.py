"""Graded questions, learner side: an id, points, the answers a check reads, and the public check.

A lab's questions live in `lab_utils/grading/questions/labNN.py` (see docs/AUTHORING.md):

    @scenario("01")
    def _(rng):                                   # the lab's inputs, drawn from the notebook's SEED
        return {"gpu": rng.choice(["H100-80GB", "L40S"]), "batch": rng.randint(4, 64)}

    @question("01.kv_bytes_per_token", points=2, answers=["kv_bytes_per_token"],
              forbid=["lab_utils.memory.kv:kv_cache_bytes_per_token"])
    def _(kv_bytes_per_token):                    # public: in the notebook, <= 2 fixed cases
        assert int(kv_bytes_per_token(1, 1, 1, 1)) > 1, "a token stores a key AND a value"

The hidden check of each question lives on the instructor's side (`grader/hidden/labNN.py`), which
no notebook and no sandbox can see.

A check gets the learner's answers by name, returns None (full points) or a fraction in [0, 1]
(partial credit), and raises AssertionError with a hint (never the answer) when it is wrong.
Checks must not trust the objects they receive: compare `int(x) == n`, `list(map(int, xs))`,
never `x == expected` on an object whose `__eq__` the learner wrote. The grader's score is the
public fraction times the hidden fraction.
"""

from __future__ import annotations

import hashlib
import importlib
import pkgutil
import random
from collections.abc import Callable
from dataclasses import dataclass, field

_REGISTRY: dict[str, Question] = {}
_SCENARIOS: dict[str, Callable[[random.Random], dict]] = {}
_LIMITS: dict[str, dict] = {}
DEFAULT_LIMITS = {"memory_mb": 8192, "timeout": 900}


@dataclass(frozen=True)
class Question:
    """One graded question."""

    id: str  # "<lab>.<name>", e.g. "00.num_layers"
    points: float
    answers: tuple[str, ...]  # names the check reads from the notebook's globals
    fn: Callable[..., float | None] = field(compare=False, repr=False)
    description: str = ""
    # "module:attr" of reference implementations the answer may neither be nor call: name families
    # of the catalogue, `forbid=refs("percentiles")` (lab_utils.grading.forbidden)
    forbid: tuple[str, ...] = ()
    # answers that may legitimately be None (rare); any other None answer scores zero
    allow_none: tuple[str, ...] = ()
    # a prediction made before a cell measures the same figure (every lab has at least one)
    predict: bool = False
    # the catalogue families `forbid` came from (lab_utils.grading.forbidden.refs)
    families: tuple[str, ...] = ()

    @property
    def lab(self) -> str:
        return self.id.split(".", 1)[0]


def question(
    qid: str,
    points: float,
    answers: list[str],
    description: str = "",
    forbid: list[str] | None = None,
    allow_none: list[str] | None = None,
    predict: bool = False,
):
    """Register the public check function for question `qid` (decorator)."""
    if "." not in qid or not qid.split(".", 1)[0].isdigit():
        raise ValueError(f"question id {qid!r} must look like '02.name' (lab number, dot, name)")
    if points <= 0:
        raise ValueError(f"question {qid}: points must be positive, got {points}")
    if not answers:
        raise ValueError(f"question {qid}: name at least one answer variable")

    def register(fn: Callable[..., float | None]) -> Callable[..., float | None]:
        _REGISTRY[qid] = Question(
            qid,
            float(points),
            tuple(answers),
            fn,
            description or (fn.__doc__ or "").strip(),
            tuple(forbid or ()),
            tuple(allow_none or ()),
            bool(predict),
            tuple(getattr(forbid, "families", ())),
        )
        return fn

    return register


def limits(lab: str, memory_mb: int | None = None, timeout: float | None = None) -> None:
    """Declare what lab `lab`'s notebook needs when graded as a learner submits it (LIGHT = False):
    memory in MB (proportional set size of the kernel and every server it starts) and wall time."""
    lab = str(lab).zfill(2)
    declared = dict(DEFAULT_LIMITS)
    if memory_mb is not None:
        declared["memory_mb"] = int(memory_mb)
    if timeout is not None:
        declared["timeout"] = float(timeout)
    _LIMITS[lab] = declared


def lab_limits(lab: str) -> dict:
    """The grader's default limits for lab `lab`: {"memory_mb": ..., "timeout": ...}."""
    _load_all()
    return dict(_LIMITS.get(str(lab).zfill(2), DEFAULT_LIMITS))


def scenario(lab: str):
    """Register lab `lab`'s scenario: `fn(rng: random.Random) -> dict` of plain values."""
    lab = str(lab).zfill(2)

    def register(fn: Callable[[random.Random], dict]) -> Callable[[random.Random], dict]:
        _SCENARIOS[lab] = fn
        return fn

    return register


def seeded_rng(seed: int, purpose: str) -> random.Random:
    """A random.Random for one purpose ("scenario", "hidden") derived from a seed."""
    digest = hashlib.sha256(f"{int(seed)}/{purpose}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def lab_scenario(lab: str, seed: int = 0) -> dict:
    """The scenario inputs of lab `lab` for `seed` (the notebook's SEED parameter).

    Compute your answers from these values: the grader runs your notebook with its own seed.
    """
    _load_all()
    lab = str(lab).zfill(2)
    if lab not in _SCENARIOS:
        raise KeyError(f"lab {lab} has no scenario; labs with one: {sorted(_SCENARIOS)}")
    try:
        seed = int(seed)
    except (TypeError, ValueError):
        raise ValueError(f"SEED must be an integer, got {seed!r}") from None
    return dict(_SCENARIOS[lab](seeded_rng(seed, f"scenario/{lab}")))


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
