"""`python -m grader grade SUBMISSIONS --out OUT ...`: grade a class."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lab_utils.grading import safe_ast


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m grader", description="Grade submitted LLM Serving Lab notebooks."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("grade", help="grade a folder of submissions (one folder per student)")
    g.add_argument("submissions", type=Path, help="folder with one sub-folder per student")
    g.add_argument("--out", type=Path, required=True, help="where gradebook.csv and feedback go")
    g.add_argument(
        "--hidden-tests",
        type=Path,
        default=None,
        help="instructor folder of hidden tests (labNN/test_*.py or test_NN_*.py)",
    )
    g.add_argument(
        "--workers",
        type=int,
        default=1,
        help="notebooks graded at once (default 1); with --ray, the CPUs of the local Ray "
        "cluster started for the run",
    )
    g.add_argument(
        "--ray",
        action="store_true",
        help="run each notebook as a Ray task (starts a local Ray cluster and stops it)",
    )
    g.add_argument(
        "--ray-address",
        default=None,
        metavar="ADDRESS",
        help="run the tasks on an existing Ray cluster, e.g. ray://head:10001 or auto",
    )
    g.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds allowed per notebook (default: what the lab declares, 900 for most)",
    )
    g.add_argument(
        "--memory-mb",
        type=int,
        default=None,
        help="memory limit per notebook run (kernel and the servers it starts, proportional set "
        "size) in MB; 0 for none (default: what the lab declares, 8192 for most)",
    )
    g.add_argument(
        "--disk-mb",
        type=int,
        default=512,
        help="bytes a notebook may write outside its private /tmp, in MB (default 512)",
    )
    g.add_argument(
        "--tmp-mb",
        type=int,
        default=4096,
        help="size of each run's private /tmp, its working folder (in memory), in MB (default 4096)",
    )
    g.add_argument(
        "--copies",
        choices=["zero", "flag"],
        default="zero",
        help="a notebook that is mostly the published solution: score 0 (default) or only flag it",
    )
    g.add_argument(
        "--no-sandbox",
        action="store_true",
        help="run learner code without bubblewrap (only where it cannot run: a hostile notebook "
        "could then read your files and forge its grade; every row says 'unsandboxed')",
    )
    g.add_argument("--force", action="store_true", help="regrade unchanged submissions too")
    g.add_argument(
        "--seed",
        type=int,
        default=None,
        help="grading seed: each notebook runs on a scenario drawn from it and the hidden "
        "checks draw their cases from it (default: the seed kept in the instructor's "
        "folder, $LAB_INSTRUCTOR_DIR or ~/.config/llm-serving-lab/instructor/seed)",
    )
    g.add_argument(
        "-p",
        "--parameter",
        nargs=2,
        action="append",
        metavar=("NAME", "VALUE"),
        default=[],
        help="set a notebook parameter for every run, e.g. -p LIGHT True",
    )
    q = sub.add_parser("questions", help="list the graded questions of a lab")
    q.add_argument("lab")
    args = parser.parse_args(argv)

    if args.command == "questions":
        from .registry import questions_for

        for item in questions_for(args.lab):
            print(f"{item.id:32s} {item.points:g} pts  answers: {', '.join(item.answers)}")
        return 0

    from .grader import grade_class

    params = {}
    for name, value in args.parameter:
        try:
            params[name] = safe_ast.literal_eval(value)
        except (ValueError, SyntaxError):
            params[name] = value
    try:
        grade_class(
            args.submissions,
            args.out,
            args.hidden_tests,
            workers=args.workers,
            timeout=args.timeout,
            memory_mb=args.memory_mb,
            force=args.force,
            parameters=params,
            seed=args.seed,
            ray=args.ray,
            ray_address=args.ray_address,
            sandboxed=not args.no_sandbox,
            disk_mb=args.disk_mb,
            tmp_mb=args.tmp_mb,
            copies=args.copies,
            progress=lambda line: print(line, flush=True),
        )
    except KeyboardInterrupt:
        print(
            "interrupted: every grade that finished is saved; run the same command to go on", file=sys.stderr
        )
        return 130
    except (ValueError, RuntimeError) as exc:  # bad arguments, no sandbox, or Ray did not start
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
