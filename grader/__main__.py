"""`python -m grader grade SUBMISSIONS --out OUT ...`: grade a class; collect it from nbgrader's
exchange, return feedback there, export the grades for an LMS, and write the class report.

    python -m grader grade SOURCE --out OUT [--due DATE] ...    SOURCE: one folder per student, or
                                                                nbgrader's exchange / submitted/
    python -m grader collect SOURCE --out OUT [--due DATE]      only copy nbgrader's layout (a dry run)
    python -m grader return OUT --course-dir DIR [--exchange ROOT --course ID]
    python -m grader export OUT --format canvas|moodle|csv|report [--to FILE]
    python -m grader report OUT
    python -m grader gradescope-bundle DEST.zip --lab NN
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lab_utils.grading import safe_ast

from .exchange import is_nbgrader_layout
from .untrusted import plain


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
    _exchange_options(g)
    q = sub.add_parser("questions", help="list the graded questions of a lab")
    q.add_argument("lab")
    _class_commands(sub)
    args = parser.parse_args(argv)

    if args.command in CLASS_COMMANDS:
        try:
            return CLASS_COMMANDS[args.command](args)
        except (ValueError, OSError) as exc:
            print(f"error: {plain(exc, 600)}", file=sys.stderr)
            return 2
    if args.command == "questions":
        from .registry import questions_for

        for item in questions_for(args.lab):
            print(f"{item.id:32s} {item.points:g} pts  answers: {', '.join(item.answers)}")
        return 0

    from .classrun import grade_class

    params = {}
    for name, value in args.parameter:
        try:
            params[name] = safe_ast.literal_eval(value)
        except (ValueError, SyntaxError):
            params[name] = value
    try:
        due = _due(args.due)
        submissions, collected = args.submissions, []
        if is_nbgrader_layout(args.submissions):
            collected = _collect(args.submissions, args.out, due, not args.no_owner_check)
            submissions = args.out / "collected"
        outcomes = grade_class(
            submissions,
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
        _after_grading(args.out, outcomes, collected)
    except KeyboardInterrupt:
        print(
            "interrupted: every grade that finished is saved; run the same command to go on", file=sys.stderr
        )
        return 130
    except (ValueError, RuntimeError) as exc:  # bad arguments, no sandbox, or Ray did not start
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


# --- running a class: nbgrader's exchange, LMS exports, the report ------------------------------


def _exchange_options(g: argparse.ArgumentParser) -> None:
    g.add_argument(
        "--due",
        default=None,
        metavar="DATE",
        help="due date (ISO 8601, e.g. 2026-12-10T17:00+01:00; UTC without a zone): submissions "
        "from nbgrader's exchange stamped later are marked late (graded all the same)",
    )
    g.add_argument(
        "--no-owner-check",
        action="store_true",
        help="accept an inbound/ submission whose folder belongs to another unix user than the "
        "student it names (by default it is refused)",
    )


def _due(text: str | None):
    from .exchange import parse_timestamp

    if text is None:
        return None
    try:
        return parse_timestamp(text)
    except ValueError as exc:
        raise ValueError(f"--due {plain(text, 60)!r}: {exc}; write e.g. 2026-12-10T17:00+01:00") from None


def _collect(source: Path, out: Path, due, check_owner: bool):
    from .exchange import collect, write_manifest

    out.mkdir(parents=True, exist_ok=True)
    subs, warnings = collect(source, out / "collected", due, check_owner)
    write_manifest(out, source, subs, due)
    for w in warnings:
        print(f"warning: {w}")
    taken = sum(not s.status for s in subs)
    print(f"collected {taken} of {len(subs)} submission(s) from {source} into {out / 'collected'}")
    for s in subs:
        if s.status or s.notes:
            why = "; ".join([s.status, *s.notes] if s.status else s.notes)
            print(plain(f"  {s.student}/{s.assignment}: {why}", 500))
    return subs


def _after_grading(out: Path, outcomes, collected) -> None:
    """Rows for submissions the exchange gave but nothing could run, late notes, and the report."""
    from .gradebook import atomic_write as _write
    from .gradebook import summary_text, write_gradebook, write_histogram
    from .report import write_report

    if collected:
        from .exchange import add_notes, refused_outcomes
        from .registry import questions_for

        add_notes(outcomes, collected)
        extra = refused_outcomes(collected, lambda lab: {q.id: q.points for q in questions_for(lab)})
        if extra:
            outcomes = outcomes + extra
            write_gradebook(out, outcomes)
            _write(out / "summary.txt", summary_text(outcomes) + "\n")
            write_histogram(out, outcomes)
    print(f"report: {write_report(out, outcomes)}")


def _cmd_collect(args) -> int:
    _collect(args.source, args.out, _due(args.due), not args.no_owner_check)
    return 0


def _cmd_return(args) -> int:
    from .exchange import write_feedback

    if not args.course_dir.is_dir():
        raise ValueError(f"--course-dir {args.course_dir} is not a folder (nbgrader's course directory)")
    exchange = None
    if args.exchange is not None:
        if not args.course:
            raise ValueError("--exchange needs --course (nbgrader's course id)")
        exchange = args.exchange / args.course
        if not exchange.is_dir():
            raise ValueError(f"{exchange} is not a folder: no such course in the exchange")
    written, skipped = write_feedback(args.out, args.course_dir, exchange)
    for why in skipped:
        print(f"no feedback: {why}")
    where = f" and released to {exchange / 'feedback'}" if exchange else ""
    print(f"{len(written)} feedback page(s) in {args.course_dir / 'feedback'}{where}")
    if not exchange:
        print("next: nbgrader release_feedback ASSIGNMENT --course ID (once per assignment)")
    return 0


def _cmd_export(args) -> int:
    if args.format == "report":
        from .instructor import signing_key
        from .report import write_report

        path = write_report(args.out, secret=signing_key(lambda line: None))
        if args.to:
            args.to.write_bytes(path.read_bytes())
            path = args.to
        print(f"report: {path}")
        return 0
    if args.format == "gradescope":
        raise ValueError(
            "a Gradescope autograder is built, not exported: python -m grader gradescope-bundle DEST.zip --lab NN"
        )
    from .lms import export

    suffix = {"canvas": "canvas.csv", "moodle": "moodle.csv", "csv": "grades.csv"}[args.format]
    print(f"{args.format}: {export(args.out, args.to or args.out / suffix, args.format)}")
    return 0


def _cmd_report(args) -> int:
    args.format, args.to = "report", None
    return _cmd_export(args)


def _cmd_bundle(args) -> int:
    from .gradescope import build_bundle

    path = build_bundle(args.dest, args.lab)
    print(f"Gradescope autograder for lab {args.lab}: {path} ({path.stat().st_size >> 10} KiB)")
    return 0


def _cmd_gradescope_run(args) -> int:
    from .gradescope import run

    print(f"results: {run(args.root, args.lab)}")
    return 0


CLASS_COMMANDS = {
    "collect": _cmd_collect,
    "return": _cmd_return,
    "export": _cmd_export,
    "report": _cmd_report,
    "gradescope-bundle": _cmd_bundle,
    "gradescope-run": _cmd_gradescope_run,
}


def _class_commands(sub) -> None:
    c = sub.add_parser(
        "collect", help="copy nbgrader's exchange or submitted/ into OUT/collected (no grading)"
    )
    c.add_argument(
        "source", type=Path, help="<exchange>/<course>, its inbound/, a course folder or submitted/"
    )
    c.add_argument("--out", type=Path, required=True)
    _exchange_options(c)
    r = sub.add_parser("return", help="write feedback where nbgrader's release_feedback reads it")
    r.add_argument("out", type=Path, help="the OUT of a grade run that collected from nbgrader")
    r.add_argument("--course-dir", type=Path, required=True, help="nbgrader's course directory")
    r.add_argument("--exchange", type=Path, default=None, help="also release it: the exchange root")
    r.add_argument("--course", default=None, help="nbgrader course id (with --exchange)")
    e = sub.add_parser("export", help="the gradebook as an LMS import file, or the report")
    e.add_argument("out", type=Path, help="the OUT of a grade run")
    e.add_argument("--format", required=True, choices=["canvas", "moodle", "csv", "report", "gradescope"])
    e.add_argument("--to", type=Path, default=None, help="file to write (default OUT/<format>.csv)")
    p = sub.add_parser("report", help="write OUT/report.html again from OUT")
    p.add_argument("out", type=Path)
    b = sub.add_parser("gradescope-bundle", help="a Gradescope autograder zip for one lab")
    b.add_argument("dest", type=Path)
    b.add_argument("--lab", required=True)
    gr = sub.add_parser("gradescope-run", help="inside Gradescope: grade /autograder/submission")
    gr.add_argument("--root", type=Path, default=Path("/autograder"))
    gr.add_argument("--lab", required=True)


if __name__ == "__main__":
    sys.exit(main())
