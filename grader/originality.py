"""Is the work the learner's own? Two static checks on the submitted notebook, judge side only.

1. **A copy of the published solution.** The course's solutions are public. A submission in which
   most of the lab's answer blocks (the code between `### BEGIN SOLUTION` and `### END SOLUTION` in
   `solutions/NN_*.ipynb`) appear verbatim — the same tokens, whitespace and comments aside — scores
   0 with the status "copy of the published solution". An instructor can make it a flag only
   (`--copies flag`). Single matching blocks are listed in the summary, never zeroed.
2. **A pasted reference.** For each question, the learner's definition of an answer and every
   notebook definition it uses (by name, directly or not) are compared with the source of each
   reference that question forbids (never another question's, never a hidden reference: the
   sandboxed runner refuses copies of those by code fingerprint). Equal syntax trees (positions,
   docstrings and comments ignored, names kept, the definition's own name aside) score zero on that
   question; a similarity of FLAG_SIMILARITY or more once every name is ignored is only flagged,
   for the instructor, unless the published solution's own definition resembles the reference as
   much. The threshold is calibrated on honest answers (tests/test_originality.py).
"""

from __future__ import annotations

import ast
import difflib
import inspect
import io
import re
import tokenize
from dataclasses import dataclass, field
from pathlib import Path

from lab_utils.grading import safe_ast

REPO = Path(__file__).resolve().parent.parent
BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
COPY_SHARE = 0.6  # of the lab's answer blocks, verbatim
MIN_BLOCKS = 2
MIN_TOKENS = 8  # a shorter block is too generic to count as copied (`x = 3`)


def _tokens(code: str) -> list[str]:
    """The code's tokens without comments and blank lines; magics dropped."""
    code = safe_ast.without_magics(code)
    out = []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(code).readline):
            if tok.type in (tokenize.COMMENT, tokenize.NL, tokenize.ENDMARKER):
                continue
            out.append({tokenize.INDENT: "<indent>", tokenize.DEDENT: "<dedent>"}.get(tok.type, tok.string))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return code.split()
    return out


def solution_blocks(lab: str) -> list[str]:
    """The answer blocks of lab `lab`'s published solution (source text of each)."""
    import nbformat

    path = next(iter(sorted((REPO / "solutions").glob(f"{lab}_*.ipynb"))), None)
    if path is None:
        return []
    nb = nbformat.read(str(path), as_version=4)
    blocks = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        for m in re.finditer(
            re.escape(BEGIN) + r"[^\n]*\n(.*?)^[ \t]*" + re.escape(END), cell.source, re.S | re.M
        ):
            blocks.append(_dedent(m.group(1)))
    return [b for b in blocks if len(_tokens(b)) >= MIN_TOKENS]


def _dedent(text: str) -> str:
    import textwrap

    return textwrap.dedent(text)


def _code_cells(nb) -> list[str]:
    return [c.source for c in nb.cells if c.cell_type == "code"]


def copied_blocks(nb, lab: str) -> tuple[int, int]:
    """(blocks of the published solution found verbatim in `nb`, blocks in the solution)."""
    blocks = solution_blocks(lab)
    if not blocks:
        return 0, 0
    cells = ["\0".join(_tokens(_dedent(src))) for src in _code_cells(nb)]
    found = 0
    for block in blocks:
        needle = "\0".join(_tokens(block))
        found += any(needle in cell for cell in cells)
    return found, len(blocks)


def is_copy(nb, lab: str) -> tuple[bool, str]:
    """Whether `nb` is mostly the published solution, and a note saying how much of it."""
    found, total = copied_blocks(nb, lab)
    note = f"{found} of {total} answer blocks of the published solution, verbatim" if total else ""
    return (total >= MIN_BLOCKS and found >= COPY_SHARE * total), note


# --- pasted references -------------------------------------------------------------------------


@dataclass
class Paste:
    """What comparing one answer with one reference found."""

    answer: str
    reference: str
    same: bool  # equal trees, names kept: scores zero
    similarity: float  # with names ignored (1.0: the same code renamed)


@dataclass
class PasteReport:
    zeroed: dict[str, str] = field(default_factory=dict)  # question id -> message
    flags: list[str] = field(default_factory=list)  # for the instructor's summary


def _strip_docstrings(tree: ast.AST) -> None:
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(body, list)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            node.body = body[1:] or [ast.Pass()]


class _Anonymise(ast.NodeTransformer):
    def visit_Name(self, node):
        return ast.copy_location(ast.Name(id="_", ctx=node.ctx), node)

    def visit_arg(self, node):
        node.arg = "_"
        return node

    def visit_Attribute(self, node):
        self.generic_visit(node)
        node.attr = "_"
        return node


def _shape(node: ast.AST, keep_names: bool) -> str:
    node = safe_ast.parse(ast.unparse(node))  # a private copy
    _strip_docstrings(node)
    top = node.body[0] if node.body else node
    if isinstance(top, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        top.name = "_"
        top.decorator_list = []
    if not keep_names:
        node = _Anonymise().visit(node)
    return ast.dump(node, annotate_fields=False, include_attributes=False)


def _definitions(nb) -> dict[str, ast.AST]:
    """The last top-level def/class of each name in the notebook (as the cells would leave it)."""
    found: dict[str, ast.AST] = {}
    for src in _code_cells(nb):
        code = safe_ast.without_magics(src)
        try:
            tree = safe_ast.parse(code)
        except SyntaxError:
            continue
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                found[node.name] = node
    return found


def reached(defs: dict[str, ast.AST], name: str) -> list[str]:
    """`name` and every notebook definition it uses, by name, directly or through another one."""
    order, todo = [], [name]
    while todo:
        current = todo.pop()
        if current in order or current not in defs:
            continue
        order.append(current)
        for node in ast.walk(defs[current]):
            if isinstance(node, ast.Name) and node.id in defs and node.id not in order:
                todo.append(node.id)
    return order


def _reference_source(spec: str) -> ast.AST | None:
    import importlib

    module, _, attr = spec.partition(":")
    try:
        obj = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
        obj = getattr(obj, "fget", None) or obj  # a property: its getter
        src = inspect.getsource(obj)
    except Exception:
        return None
    try:
        tree = safe_ast.parse(_dedent(src))
    except SyntaxError:
        return None
    return tree.body[0] if tree.body else None


def _skeleton(node: ast.AST) -> list[str]:
    """The definition's syntax as a sequence of node kinds (constants kept, names dropped): what
    `similarity` compares."""
    tree = safe_ast.parse(ast.unparse(node))
    _strip_docstrings(tree)
    out: list[str] = []

    def visit(n):
        out.append(type(n).__name__)
        if isinstance(n, ast.Constant):
            out.append(repr(n.value)[:40])
        elif isinstance(n, (ast.operator, ast.cmpop, ast.unaryop, ast.boolop)):
            return
        for child in ast.iter_child_nodes(n):
            visit(child)

    top = tree.body[0] if tree.body else tree
    for child in getattr(top, "body", [top]):
        visit(child)
    return out


def similarity(mine: ast.AST, ref: ast.AST) -> float:
    """How alike two definitions are once every name is ignored (1.0: the same code renamed)."""
    a, b = _skeleton(mine), _skeleton(ref)
    if not a or not b:
        return 0.0
    return difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()


# Calibrated on honest answers written from the text (tests/test_originality.py repeats it): the
# labs' solutions (renaming changes nothing here: names are ignored), every definition each answer
# uses against its own question's references, 102 answers; and the course tests' own answers,
# written apart from the notebooks, 48. At 0.85, 6 + 3 were flagged; at 0.90, 4 + 1 (02's
# contiguous_waste at 0.94 among them); at 0.95, 3 + 0, all three code the course library holds
# verbatim as the answer (01.spec_decode, 10's valid_tp_degrees), which the published solution
# writes the same way: a flag is not raised where the solution itself resembles the reference.
# So 0/150 honest answers are flagged. A renamed reference scores 1.00; one with a statement
# removed scores 0.95 or more in 49 of 104 references (median 0.95).
FLAG_SIMILARITY = 0.95
MIN_NODES = 40  # a reference shorter than this (a three-line formula) is too generic to flag


def _solution_answer_blocks(lab: str) -> dict[str, ast.AST]:
    """The published solution's definition of each answer: the def around its answer block."""
    import nbformat

    path = next(iter(sorted((REPO / "solutions").glob(f"{lab}_*.ipynb"))), None)
    if path is None:
        return {}
    return _definitions(nbformat.read(str(path), as_version=4))


def pasted_references(nb, questions) -> PasteReport:
    """Compare each answer, and every notebook definition it uses, with the references its own
    question forbids: equal trees with names are zeroed; alike once names are ignored is flagged,
    unless the published solution's own definition is as alike (the text's answer is that code)."""
    report = PasteReport()
    defs = _definitions(nb)
    solutions: dict[str, dict[str, ast.AST]] = {}
    for q in questions:
        refs = [(spec, _reference_source(spec)) for spec in q.forbid]
        refs = [(spec, node, _shape(node, True)) for spec, node in refs if node is not None]
        published = solutions.setdefault(q.lab, _solution_answer_blocks(q.lab))
        for name in q.answers:
            for used in reached(defs, name):
                mine = defs[used]
                mine_named = _shape(mine, True)
                label = f"`{name}`" if used == name else f"`{used}` (used by `{name}`)"
                for spec, ref, ref_named in refs:
                    if mine_named == ref_named:
                        report.zeroed[q.id] = (
                            f"{label} is the course's `{spec.split(':')[-1]}` pasted in; write your own"
                        )
                        continue
                    if len(_skeleton(ref)) < MIN_NODES:
                        continue
                    ratio = similarity(mine, ref)
                    if ratio < FLAG_SIMILARITY:
                        continue
                    sol = published.get(used)
                    if sol is not None and similarity(sol, ref) >= FLAG_SIMILARITY:
                        continue  # the text's own answer is written this way: no evidence of copying
                    report.flags.append(
                        f"{q.id}: {label} resembles the course's `{spec.split(':')[-1]}` with names "
                        f"changed (similarity {ratio:.2f})"
                    )
    return report
