"""Is the work the learner's own? Two static checks on the submitted notebook, judge side only.

1. **A copy of the published solution.** The course's solutions are public. A submission in which
   most of the lab's answer blocks (the code between `### BEGIN SOLUTION` and `### END SOLUTION` in
   `solutions/NN_*.ipynb`) appear verbatim — the same tokens, whitespace and comments aside — scores
   0 with the status "copy of the published solution". An instructor can make it a flag only
   (`--copies flag`). Single matching blocks are listed in the summary, never zeroed.
2. **A pasted reference.** For each question, the learner's definition of an answer (the last
   top-level `def`/`class` of that name in the notebook) is compared with the source of each
   reference the question forbids. Equal syntax trees (positions, docstrings and comments ignored,
   names kept, the definition's own name aside) score zero on that question; equal trees once every
   name is ignored are only flagged, with a similarity figure.
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

REPO = Path(__file__).resolve().parent.parent
BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
COPY_SHARE = 0.6  # of the lab's answer blocks, verbatim
MIN_BLOCKS = 2
MIN_TOKENS = 8  # a shorter block is too generic to count as copied (`x = 3`)


def _tokens(code: str) -> list[str]:
    """The code's tokens without comments and blank lines; magics dropped."""
    code = "\n".join(line for line in code.splitlines() if not line.lstrip().startswith(("%", "!")))
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
    node = ast.parse(ast.unparse(node))  # a private copy
    _strip_docstrings(node)
    top = node.body[0] if node.body else node
    if isinstance(top, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        top.name = "_"
        top.decorator_list = []
    if not keep_names:
        node = _Anonymise().visit(node)
    return ast.dump(node, annotate_fields=False, include_attributes=False)


def _definitions(nb) -> dict[str, ast.AST]:
    """The last top-level def/class (or `name = lambda ...`) of each name in the notebook."""
    found: dict[str, ast.AST] = {}
    for src in _code_cells(nb):
        code = "\n".join(line for line in src.splitlines() if not line.lstrip().startswith(("%", "!")))
        try:
            tree = ast.parse(code)
        except SyntaxError:
            continue
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                found[node.name] = node
    return found


def _reference_source(spec: str) -> ast.AST | None:
    import importlib

    module, _, attr = spec.partition(":")
    try:
        obj = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
        src = inspect.getsource(obj)
    except Exception:
        return None
    try:
        tree = ast.parse(_dedent(src))
    except SyntaxError:
        return None
    return tree.body[0] if tree.body else None


def pasted_references(nb, questions) -> PasteReport:
    """Compare each answer's definition with each reference its question forbids."""
    report = PasteReport()
    defs = _definitions(nb)
    for q in questions:
        for name in q.answers:
            mine = defs.get(name)
            if mine is None:
                continue
            mine_named, mine_anon = _shape(mine, True), _shape(mine, False)
            for spec in q.forbid:
                ref = _reference_source(spec)
                if ref is None:
                    continue
                ref_named, ref_anon = _shape(ref, True), _shape(ref, False)
                if mine_named == ref_named:
                    report.zeroed[q.id] = (
                        f"`{name}` is the course's reference `{spec.split(':')[-1]}` pasted in; write your own"
                    )
                elif mine_anon == ref_anon or (
                    len(ref_anon) > 200
                    and difflib.SequenceMatcher(None, mine_anon, ref_anon).quick_ratio() > 0.9
                ):
                    ratio = difflib.SequenceMatcher(None, mine_anon, ref_anon).ratio()
                    report.flags.append(
                        f"{q.id}: `{name}` resembles the reference `{spec.split(':')[-1]}` with names changed "
                        f"(similarity {ratio:.2f})"
                    )
    return report
