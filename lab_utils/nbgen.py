"""Generate the student notebooks in labs/ from the single source in solutions/.

    python -m lab_utils.nbgen            # rewrite labs/ from solutions/
    python -m lab_utils.nbgen --check    # exit 1 when labs/ is stale (CI)
    python -m lab_utils.nbgen --strip    # also clear outputs in solutions/ in place

In each code cell, the lines between `### BEGIN SOLUTION` and `### END SOLUTION` become one
`raise NotImplementedError(...)` at the marker's indentation. Cells tagged `solution` are dropped.
Outputs, execution counts and widget state are cleared in both copies.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

BEGIN = "### BEGIN SOLUTION"
END = "### END SOLUTION"
STUB = 'raise NotImplementedError("your answer here")'
GENERATED_NOTE = "generated from solutions/ by `python -m lab_utils.nbgen`; edit the solution, not this copy"


def stub_source(source: str, where: str = "cell") -> str:
    """Replace every BEGIN/END SOLUTION region of a cell's source with a stub."""
    out: list[str] = []
    inside = False
    for lineno, line in enumerate(source.splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith(BEGIN):
            if inside:
                raise ValueError(f"{where}, line {lineno}: nested {BEGIN}")
            inside = True
            indent = line[: len(line) - len(line.lstrip())]
            out.append(f"{indent}{STUB}")
        elif stripped.startswith(END):
            if not inside:
                raise ValueError(f"{where}, line {lineno}: {END} without {BEGIN}")
            inside = False
        elif not inside:
            out.append(line)
    if inside:
        raise ValueError(f"{where}: {BEGIN} is never closed by {END}")
    return "\n".join(out)


def _clear(nb) -> None:
    nb.metadata.pop("widgets", None)
    nb.metadata.pop("papermill", None)
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        cell.metadata.pop("papermill", None)
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None


def student_notebook(solution_path: Path):
    """The student copy of one solution notebook (an nbformat node)."""
    import nbformat

    nb = nbformat.read(str(solution_path), as_version=4)
    _clear(nb)
    cells = []
    for i, cell in enumerate(nb.cells):
        if "solution" in cell.metadata.get("tags", []):
            continue
        if cell.cell_type == "code":
            cell.source = stub_source(cell.source, f"{solution_path.name}, cell {i}")
        cells.append(cell)
    banner = nbformat.v4.new_markdown_cell(
        f"*This copy was {GENERATED_NOTE.replace('; ', '. Course authors: ')}. Learners: this is your copy; "
        "work in it.*"
    )
    banner.metadata["tags"] = ["generated"]
    banner.id = "generated-banner"  # a fixed id, so regenerating an unchanged lab changes nothing
    nb.cells = [banner] + cells
    nb.metadata["lab_generated"] = GENERATED_NOTE
    return nb


def _dumps(nb) -> str:
    import nbformat

    return nbformat.writes(nb) + "\n"


def main(argv: list[str] | None = None) -> int:
    import nbformat

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--solutions", type=Path, default=Path(__file__).resolve().parent.parent / "solutions"
    )
    parser.add_argument("--labs", type=Path, default=Path(__file__).resolve().parent.parent / "labs")
    parser.add_argument("--check", action="store_true", help="fail when labs/ is out of date")
    parser.add_argument("--strip", action="store_true", help="clear outputs in solutions/ too")
    args = parser.parse_args(argv)

    stale: list[str] = []
    sources = sorted(args.solutions.glob("[0-9][0-9]_*.ipynb"))
    if not sources:
        print(f"no solution notebooks in {args.solutions}", file=sys.stderr)
        return 1
    wanted = set()
    for src in sources:
        wanted.add(src.name)
        solution = nbformat.read(str(src), as_version=4)
        has_outputs = any(c.cell_type == "code" and (c.outputs or c.execution_count) for c in solution.cells)
        if has_outputs:
            if args.strip:
                _clear(solution)
                src.write_text(_dumps(solution))
            else:
                stale.append(f"{src} has outputs (run with --strip)")
        text = _dumps(student_notebook(src))
        dst = args.labs / src.name
        if not dst.exists() or dst.read_text() != text:
            if args.check:
                stale.append(f"{dst} is stale")
            else:
                dst.parent.mkdir(parents=True, exist_ok=True)
                dst.write_text(text)
                print(f"wrote {dst}")
    for extra in sorted(args.labs.glob("[0-9][0-9]_*.ipynb")):
        if extra.name not in wanted:
            if args.check:
                stale.append(f"{extra} has no solution")
            else:
                extra.unlink()
                print(f"removed {extra}")
    for msg in stale:
        print(msg, file=sys.stderr)
    # stale only collects problems that must fail: outputs left in solutions/ (without --strip)
    # and, with --check, out-of-date or orphaned lab copies
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
