"""The grader is a one-way pipeline (issue 47 item 6): screen, run, judge, record, each a module that
imports only the stages before it; the orchestrator (grader.py) imports the stages, and what grades
a class (classrun, runner, the exports) imports the orchestrator. Imports inside functions count."""

from __future__ import annotations

import ast
from pathlib import Path

GRADER = Path(__file__).resolve().parent.parent / "grader"
STAGES = ["screen", "run", "judge", "record"]  # in order
LATER = {"grader", "classrun", "runner", "__main__"}  # built on the stages, never imported by them


def _imports(module: str) -> set[str]:
    tree = ast.parse((GRADER / f"{module}.py").read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1 and node.module:
                found.add(node.module.split(".")[0])
            elif node.level == 1:
                found |= {a.name for a in node.names}
            elif node.module and node.module.startswith("grader."):
                found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[1] for a in node.names if a.name.startswith("grader.")}
    return {m for m in found if (GRADER / f"{m}.py").exists()}


def _graph() -> dict[str, set[str]]:
    return {p.stem: _imports(p.stem) for p in GRADER.glob("*.py")}


def test_the_grader_modules_import_each_other_without_a_circle():
    graph = _graph()
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            assert state.get(nxt) != 1, "import circle: " + " -> ".join([*path, node, nxt])
            if nxt not in state:
                visit(nxt, [*path, node])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [])


def test_each_stage_imports_only_the_stages_before_it():
    graph = _graph()
    for i, stage in enumerate(STAGES):
        reach, todo = set(), [stage]
        while todo:  # everything the stage imports, directly or through a helper module
            for nxt in graph[todo.pop()]:
                if nxt not in reach:
                    reach.add(nxt)
                    todo.append(nxt)
        later = set(STAGES[i + 1 :]) | LATER
        assert not reach & later, f"{stage} reaches {sorted(reach & later)}"
    assert set(STAGES) <= graph["grader"], "the orchestrator runs every stage"


def test_the_orchestrator_grades_through_the_stages_in_order():
    source = (GRADER / "grader.py").read_text()
    body = source[source.index("    def grade(self, job: Job)") : source.index("    def _run(self")]
    calls = [body.index(s) for s in ("screen(", "self._run(", "judge_lab(", "self._keep_executed(")]
    assert calls == sorted(calls), calls
