"""Copies of the published solution and pasted references (grader/originality.py). Quick: static."""

from __future__ import annotations

import inspect
from pathlib import Path

import nbformat
import pytest
from submissions import notebook, put

from grader.grader import Grader, Job
from grader.originality import copied_blocks, is_copy, pasted_references
from grader.sandbox import Status
from lab_utils.grading import questions_for

REPO = Path(__file__).resolve().parent.parent
SOLUTIONS = sorted((REPO / "solutions").glob("[0-9][0-9]_*.ipynb"))


@pytest.mark.parametrize("path", SOLUTIONS, ids=[p.stem for p in SOLUTIONS])
def test_the_published_solution_is_a_copy_and_the_stub_is_not(path):
    lab = path.name[:2]
    solution = nbformat.read(str(path), as_version=4)
    copied, note = is_copy(solution, lab)
    assert copied, note
    stub = nbformat.read(str(REPO / "labs" / path.name), as_version=4)
    found, total = copied_blocks(stub, lab)
    assert total >= 2 and found == 0, (found, total)


def test_a_few_matching_blocks_are_not_a_copy():
    path = SOLUTIONS[2]
    lab = path.name[:2]
    nb = nbformat.read(str(path), as_version=4)
    found, total = copied_blocks(nb, lab)
    # keep one answer block verbatim; the learner rewrote the others
    kept = 0
    for cell in nb.cells:
        if cell.cell_type == "code" and "### BEGIN SOLUTION" in cell.source:
            if kept:
                cell.source = "# my own answer\nanswer = compute_it_myself()\n"
            kept += 1
    assert not is_copy(nb, lab)[0]
    assert copied_blocks(nb, lab)[0] <= 1 < found <= total


def test_a_learner_handing_in_the_solution_scores_zero_with_that_status(tmp_path):
    path = next(p for p in SOLUTIONS if p.name.startswith("07"))
    put(tmp_path / "subs", "ana", nbformat.read(str(path), as_version=4), path.name)
    grader = Grader(tmp_path / "out", seed=11)
    try:
        outcome, feedback = grader.grade(Job("ana", "07", tmp_path / "subs" / "ana" / path.name))
    finally:
        grader.close()
    assert Status.of(outcome.status) is Status.COPY, outcome.status
    assert outcome.total == 0 and "published solution" in feedback


# lab 02's waste figure, which left the learner's copy for the grader (issue 47 item 2), stands in for
# a reference the question forbids: the paste check reads any reference's source the same way
WASTE = "grader.hidden.lab02:_ref_never_used"


def _waste_question():
    from lab_utils.grading.registry import Question

    return [
        Question(
            "02.contiguous_waste", 2, ("contiguous_waste",), fn=lambda contiguous_waste: None, forbid=(WASTE,)
        )
    ]


def test_a_pasted_reference_is_zeroed_and_a_renamed_one_flagged():
    from grader.hidden.lab02 import _ref_never_used

    source = inspect.getsource(_ref_never_used).replace("def _ref_never_used", "def contiguous_waste")
    renamed = source.replace("reserved", "booked").replace("stored", "kept").replace("workload", "reqs")
    own = "def contiguous_waste(reqs):\n    total = 0\n    used = 0\n    for r in reqs:\n        total += r.prompt_len + r.max_tokens\n        used += r.prompt_len + r.output_len\n    return 1 - used / total\n"
    qs = _waste_question()
    pasted = pasted_references(notebook(source), qs)
    assert list(pasted.zeroed) == ["02.contiguous_waste"] and not pasted.flags
    flagged = pasted_references(notebook(renamed), qs)
    assert not flagged.zeroed and len(flagged.flags) == 1 and "similarity 1.00" in flagged.flags[0]
    honest = pasted_references(notebook(own), qs)
    assert not honest.zeroed and not honest.flags


def _solution(lab: str):
    import nbformat

    path = next(iter(sorted((REPO / "solutions").glob(f"{lab}_*.ipynb"))))
    return nbformat.read(str(path), as_version=4)


LABS = sorted(p.name[:2] for p in (REPO / "solutions").glob("[0-9][0-9]_*.ipynb"))


@pytest.mark.parametrize("lab", LABS)
def test_honest_answers_are_neither_zeroed_nor_flagged(lab):
    """The calibration (grader.originality.FLAG_SIMILARITY): the published solution, written from the
    text, compared with its own questions' references, raises no flag; no flag names anything of
    the grader's hidden side."""
    report = pasted_references(_solution(lab), questions_for(lab))
    assert not report.zeroed and not report.flags, (report.zeroed, report.flags)


def test_the_paste_check_follows_the_helpers_an_answer_calls():
    from grader.hidden.lab02 import _ref_never_used

    helper = inspect.getsource(_ref_never_used)
    source = helper + "\n\ndef contiguous_waste(reqs):\n    return _ref_never_used(reqs)\n"
    qs = _waste_question()
    report = pasted_references(notebook(source), qs)
    assert "used by `contiguous_waste`" in report.zeroed["02.contiguous_waste"]
    renamed = helper.replace("_ref_never_used", "mine").replace("reserved", "booked")
    flagged = pasted_references(notebook(renamed + "\n\ndef contiguous_waste(r):\n    return mine(r)\n"), qs)
    assert (
        not flagged.zeroed
        and len(flagged.flags) == 1
        and "`mine` (used by `contiguous_waste`)" in flagged.flags[0]
    )
