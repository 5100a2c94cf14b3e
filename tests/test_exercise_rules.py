"""The exercise rules every lab follows (docs/AUTHORING.md), checked statically and quickly.

Every lab in solutions/ — including labs added later — must have: a scenario drawn from SEED, a
hidden check for every question, at least one predict-then-measure question, a closing "what you
measured" table, and no import of a reference its questions forbid.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import nbformat
import pytest

from grader.registry import hidden_check
from lab_utils.grading import lab_scenario, questions_for

REPO = Path(__file__).resolve().parent.parent
SOLUTIONS = sorted((REPO / "solutions").glob("[0-9][0-9]_*.ipynb"))
IDS = [p.stem for p in SOLUTIONS]


def _code(path: Path) -> list[nbformat.NotebookNode]:
    return [c for c in nbformat.read(str(path), as_version=4).cells if c.cell_type == "code"]


@pytest.mark.parametrize("path", SOLUTIONS, ids=IDS)
def test_every_question_has_a_hidden_check_and_the_lab_a_prediction(path):
    qs = questions_for(path.name[:2])
    assert len(qs) >= 2, "a lab grades at least two questions"
    assert not [q.id for q in qs if hidden_check(q.id) is None], "every question needs an @hidden check"
    assert any(q.predict for q in qs), "every lab has a predict-then-measure question (predict=True)"


@pytest.mark.parametrize("path", SOLUTIONS, ids=IDS)
def test_scenario_comes_from_the_seed_parameter(path):
    lab = path.name[:2]
    cells = _code(path)
    params = [c for c in cells if "parameters" in c.metadata.get("tags", [])]
    assert params, "the lab needs a cell tagged `parameters`"
    assert re.search(r"^SEED\s*=\s*0\b", params[0].source, re.M), "the parameters cell sets SEED = 0"
    assert any(re.search(rf"lab_scenario\(\s*['\"]{lab}['\"]\s*,\s*SEED\s*\)", c.source) for c in cells), (
        f'a setup cell draws SCENARIO = lab_scenario("{lab}", SEED)'
    )
    assert lab_scenario(lab, 0) == lab_scenario(lab, 0), "a scenario is a function of the seed"
    assert any(lab_scenario(lab, 0) != lab_scenario(lab, s) for s in (1, 2, 3)), (
        "other seeds must draw other scenarios"
    )


@pytest.mark.parametrize("path", SOLUTIONS, ids=IDS)
def test_lab_ends_with_what_you_measured(path):
    assert any("measured_table(" in c.source for c in _code(path)), (
        "end the lab with lab_utils.results.measured_table(...)"
    )


@pytest.mark.parametrize("path", SOLUTIONS, ids=IDS)
def test_no_forbidden_reference_is_imported(path):
    forbidden = {spec for q in questions_for(path.name[:2]) for spec in q.forbid}
    found = []
    for cell in _code(path):
        source = "\n".join(
            line for line in cell.source.splitlines() if not line.lstrip().startswith(("%", "!"))
        )
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                for alias in node.names:
                    if f"{node.module}:{alias.name}" in forbidden:
                        found.append(f"from {node.module} import {alias.name}")
    for spec in forbidden:
        module, _, attr = spec.partition(":")
        if any(
            re.search(rf"\b{re.escape(module.rsplit('.', 1)[-1])}\.{re.escape(attr)}\b", c.source)
            for c in _code(path)
        ):
            found.append(spec)
    assert not found, f"the notebook reaches references its questions forbid: {found}"
