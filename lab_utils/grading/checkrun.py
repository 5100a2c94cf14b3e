"""Check a lab's saved answers in a clean process (the grader starts this).

    python -m lab_utils.grading.checkrun --lab 02 --answers DIR --out scores.json

Each check gets at most --per-question seconds; a check that hangs or crashes scores zero with
the reason, and the others still run.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys


class _CheckTimeout(Exception):
    pass


def _alarm(signum, frame):
    raise _CheckTimeout()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lab", required=True)
    parser.add_argument("--answers", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--per-question", type=int, default=120)
    parser.add_argument(
        "--seed",
        type=int,
        default=None,
        help="the seed the notebook ran with; hidden checks draw their cases from it "
        "(without it, only the public checks run)",
    )
    args = parser.parse_args(argv)

    from .probe import load_answers
    from .registry import questions_for
    from .scoring import ERROR, NOT_ANSWERED, Result, score, score_graded

    answers, problems = load_answers(args.answers)
    results = []
    signal.signal(signal.SIGALRM, _alarm)
    for q in questions_for(args.lab):
        bad = [n for n in q.answers if n in problems and n not in answers]
        if bad:
            results.append(
                Result(q.id, q.points, 0.0, NOT_ANSWERED, "; ".join(f"`{n}` {problems[n]}" for n in bad))
            )
            continue
        signal.alarm(args.per_question)
        try:
            results.append(score(q, answers) if args.seed is None else score_graded(q, answers, args.seed))
        except _CheckTimeout:
            results.append(
                Result(q.id, q.points, 0.0, ERROR, f"the check took longer than {args.per_question} s")
            )
        except BaseException as exc:  # SystemExit from a learner's function, and the like
            results.append(Result(q.id, q.points, 0.0, ERROR, f"{type(exc).__name__}: {exc}"[:300]))
        finally:
            signal.alarm(0)
    with open(args.out, "w") as f:
        json.dump([r.to_dict() for r in results], f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
