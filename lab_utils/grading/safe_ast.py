"""ast conversions that are safe to run from the grader's worker threads.

CPython 3.11 keeps the depth counter of its ast <-> C conversion in one per-interpreter state, so
two threads parsing at the same moment can fail with ``SystemError: AST constructor recursion depth
mismatch`` (CI, 2026-12-03: one submission of a class graded with two workers got a "grader error"
this way). Every ast.parse, and every compile of an ast tree, in code the workers run goes through
this one lock. ast.walk and ast.unparse are pure Python and need no lock.
"""

from __future__ import annotations

import ast
import threading

LOCK = threading.RLock()


def parse(source: str, filename: str = "<unknown>", mode: str = "exec") -> ast.AST:
    with LOCK:
        return ast.parse(source, filename, mode)


def compile_tree(tree: ast.AST, filename: str, mode: str = "exec"):
    with LOCK:
        return compile(tree, filename, mode)


def literal_eval(text: str):
    with LOCK:
        return ast.literal_eval(text)


def without_magics(source: str) -> str:
    """A notebook cell's code without its IPython lines (`%magic`, `!shell`), which are not Python."""
    return "\n".join(line for line in source.splitlines() if not line.lstrip().startswith(("%", "!")))
