"""The CI table (out/grading-table.md): one row per lab, one column per submission kind.

Its cells are written by tests/test_notebooks.py (solution, bypass submissions) and
tests/test_notebooks_student.py (stub); this file runs after both (file order, or scripts/test_streams.py
runs it once both streams have ended). The published solution's column is computed here.
"""

from __future__ import annotations

import json

import nbformat
import pytest
from notebook_runs import BYPASSES, REPO, SOLUTIONS, TABLE

from lab_utils.grading import questions_for


@pytest.mark.slow
def test_zz_grading_table():
    """Assemble the CI table, one row per lab (written to out/grading-table.md and printed)."""
    cells = [json.loads(p.read_text()) for p in sorted(TABLE.glob("*.json"))] if TABLE.exists() else []
    if not cells:
        pytest.skip("no lab was graded in this session")
    columns = ["solution", "stub", *BYPASSES, "published solution"]
    from grader.originality import is_copy

    for path in SOLUTIONS:  # the published solution handed in as a learner's own: status copy, 0 points
        copied, _ = is_copy(nbformat.read(str(path), as_version=4), path.name[:2])
        cells.append(
            {
                "lab": path.name[:2],
                "column": "published solution",
                "earned": 0.0 if copied else None,
                "possible": sum(q.points for q in questions_for(path.name[:2])),
            }
        )
    by = {(c["lab"], c["column"]): c for c in cells}
    lines = ["| lab | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for lab in sorted({c["lab"] for c in cells}):
        row = []
        for col in columns:
            c = by.get((lab, col))
            row.append("—" if c is None or c["earned"] is None else f"{c['earned']:g}/{c['possible']:g}")
        lines.append(f"| {lab} | " + " | ".join(row) + " |")
    text = "\n".join(lines) + "\n"
    (REPO / "out").mkdir(exist_ok=True)
    (REPO / "out" / "grading-table.md").write_text(text)
    print("\n" + text)
