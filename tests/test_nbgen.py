"""labs/ is generated from solutions/: stubs replace answers, and a stale copy fails CI."""

from __future__ import annotations

import subprocess
import sys

import nbformat
import pytest

from lab_utils.nbgen import STUB, stub_source, student_notebook


def test_stub_replaces_region_and_keeps_indentation():
    src = "def f(x):\n    ### BEGIN SOLUTION\n    return x + 1\n    ### END SOLUTION\n\nprint(f)"
    assert stub_source(src) == f"def f(x):\n    {STUB}\n\nprint(f)"


def test_two_regions_in_one_cell():
    src = "### BEGIN SOLUTION\na = 1\n### END SOLUTION\nb = 2\n### BEGIN SOLUTION\nc = 3\n### END SOLUTION"
    assert stub_source(src) == f"{STUB}\nb = 2\n{STUB}"


@pytest.mark.parametrize(
    "src, problem",
    [
        ("### BEGIN SOLUTION\nx = 1", "never closed"),
        ("x = 1\n### END SOLUTION", "without"),
        ("### BEGIN SOLUTION\n### BEGIN SOLUTION\n### END SOLUTION", "nested"),
    ],
)
def test_malformed_markers_raise(src, problem):
    with pytest.raises(ValueError, match=problem):
        stub_source(src, "test cell")


def test_student_copy_drops_solution_cells_and_outputs(tmp_path):
    nb = nbformat.v4.new_notebook()
    answer = nbformat.v4.new_code_cell("### BEGIN SOLUTION\nanswer = 42\n### END SOLUTION")
    answer.outputs = [nbformat.v4.new_output("stream", text="42\n")]
    answer.execution_count = 3
    secret = nbformat.v4.new_code_cell("print('only in the solution')")
    secret.metadata["tags"] = ["solution"]
    nb.cells = [nbformat.v4.new_markdown_cell("# t"), answer, secret]
    path = tmp_path / "09_x.ipynb"
    nbformat.write(nb, str(path))
    student = student_notebook(path)
    assert [c.cell_type for c in student.cells] == ["markdown", "markdown", "code"]  # banner first
    assert student.cells[2].source == STUB
    assert student.cells[2].outputs == [] and student.cells[2].execution_count is None
    # random cell ids may contain "42"; look only at what a learner sees
    assert not any("42" in c.source or "only in the solution" in c.source for c in student.cells)


def test_committed_labs_are_up_to_date(repo):
    proc = subprocess.run(
        [sys.executable, "-m", "lab_utils.nbgen", "--check"], cwd=repo, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr


def test_committed_notebooks_carry_no_outputs(repo):
    for path in sorted((repo / "solutions").glob("*.ipynb")) + sorted((repo / "labs").glob("*.ipynb")):
        nb = nbformat.read(str(path), as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "code":
                assert not cell.outputs and cell.execution_count is None, f"{path.name} has outputs"


def test_every_lab_has_parameters_and_graded_questions(repo):
    from lab_utils.grading import questions_for

    for path in sorted((repo / "solutions").glob("*.ipynb")):
        nb = nbformat.read(str(path), as_version=4)
        params = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
        assert len(params) == 1, f"{path.name}: exactly one cell tagged 'parameters'"
        assert 'BACKEND = "auto"' in params[0].source, f"{path.name}: BACKEND parameter missing"
        assert "LIGHT" in params[0].source, f"{path.name}: LIGHT parameter missing"
        lab = path.name[:2]
        qs = questions_for(lab)
        assert qs, f"{path.name}: no graded questions registered for lab {lab}"
        text = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
        for q in qs:
            assert f'check("{q.id}")' in text, f"{path.name}: no public check cell for {q.id}"


def test_student_copy_says_it_is_generated(repo):
    nb = student_notebook(sorted((repo / "solutions").glob("0*.ipynb"))[0])
    first = nb.cells[0]
    assert first.cell_type == "markdown" and "generated" in first.metadata.get("tags", [])
    assert "edit the solution" in first.source
    assert "labs/*.ipynb linguist-generated" in (repo / ".gitattributes").read_text()
