"""Every lab's generated student copy (answers stubbed), run through the instructor's grader under
seed B in CPU mode, LIGHT, without servers: Run All reaches the last cell with no error cell (each cell
that needs an unwritten answer says what to write and goes on) and every question scores zero.

Its own file (the solutions are in tests/test_notebooks.py) so that `make test` runs it beside the
solution runs (scripts/test_streams.py); the stub cells it records go into the CI table
(tests/test_zz_grading_table.py).
"""

from __future__ import annotations

import pytest
from notebook_runs import (
    IDS,
    REPO,
    SEED_B,
    SKIP_SERVERS,
    SOLUTIONS,
    error_cells,
    grade,
    last_student_cell_ran,
    record,
)

from lab_utils.grading import questions_for


@pytest.mark.slow
@pytest.mark.parametrize("path", SOLUTIONS, ids=IDS)
def test_student_copy_runs_to_the_end_and_scores_zero(path, tmp_path):
    lab = REPO / "labs" / path.name
    outcome, feedback = grade(lab, tmp_path, {"BACKEND": "cpu", "LIGHT": True, **SKIP_SERVERS}, SEED_B)
    # Run All reaches the end with no error cell: each cell that needs an answer not written yet says
    # so in one line (lab_utils.notebook) and the cells that do not need it still run
    assert outcome.status == "ok", f"{outcome.status}: {error_cells(tmp_path, path.name)}"
    assert all(v == 0 for v in outcome.scores.values()), feedback
    assert len(outcome.scores) == len(questions_for(path.name[:2])) >= 2
    record(path.name[:2], "stub", outcome.total, sum(outcome.possible.values()))
    assert last_student_cell_ran(tmp_path, path.name)
