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
from lab_utils.grading.safe_ast import without_magics

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


def _parsed_cells(path: Path):
    for cell in _code(path):
        source = without_magics(cell.source)
        try:
            yield ast.parse(source)
        except SyntaxError:
            continue


@pytest.mark.parametrize("path", SOLUTIONS, ids=IDS)
def test_no_answer_is_or_uses_a_reference_its_question_forbids(path):
    """An answer's own definition never names a reference its question forbids, and no answer is
    bound by an import. (The notebook may import a reference to *measure* after a prediction: when
    the judge calls the prediction, the sandbox has replaced it by a stub that raises.)"""
    found = []
    own = {name for name, kind in _top_level_definitions(path).items() if kind in ("def", "class")}
    for q in questions_for(path.name[:2]):
        banned = {spec.partition(":")[2].split(".")[-1] for spec in q.forbid}
        banned |= {spec.partition(":")[2].split(".")[0] for spec in q.forbid}
        banned -= own  # the learner's own function of the same name (answer_drill calls spec_speedup)
        for tree in _parsed_cells(path):
            for node in tree.body:
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    bound = {(a.asname or a.name).split(".")[0] for a in node.names}
                    found += [f"{q.id}: {name} is imported" for name in bound & set(q.answers)]
                if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    continue
                if node.name not in q.answers:
                    continue
                for sub in ast.walk(node):
                    name = (
                        sub.id
                        if isinstance(sub, ast.Name)
                        else sub.attr
                        if isinstance(sub, ast.Attribute)
                        else None
                    )
                    if name in banned:
                        found.append(f"{q.id}: {node.name} uses {name}")
    assert not found, f"answers that are or call a forbidden reference: {sorted(set(found))}"


def _top_level_definitions(path: Path) -> dict[str, str]:
    """name -> "def", "class" or "value", for every top-level binding in the notebook's code cells
    (the last binding of a name wins, as it would when the cells run in order)."""
    kinds: dict[str, str] = {}
    for cell in _code(path):
        source = without_magics(cell.source)
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                kinds[node.name] = "def"
            elif isinstance(node, ast.ClassDef):
                kinds[node.name] = "class"
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    for name in ast.walk(target):
                        if isinstance(name, ast.Name):
                            kinds[name.id] = "value"
    return kinds


@pytest.mark.parametrize("path", SOLUTIONS, ids=IDS)
def test_every_graded_answer_is_a_function_or_a_class(path):
    kinds = _top_level_definitions(path)
    values = {
        q.id: [a for a in q.answers if kinds.get(a) not in ("def", "class")]
        for q in questions_for(path.name[:2])
    }
    values = {qid: names for qid, names in values.items() if names}
    assert not values, (
        "every graded answer is a function or class the judge calls on hidden cases "
        f"(a figure becomes a function of the scenario); these are values: {values}"
    )
