"""References that are absent: source-level stubs and code fingerprints (used inside the sandbox).

When the judge calls a learner's answers to question Q, the course library the runner imports is a
copy in which each of Q's forbidden references is a stub that raises `UsesReference` (the judge
builds it with `stub_source`; see grader/library.py). Nothing of the reference is left in that
process: no closure, no source for `inspect.getsource`, no module a reload could re-run.

What can still be brought in is a *copy* of a reference made elsewhere (its source `exec`-ed in the
notebook, a module file loaded by path, a cached `.pyc`). `fingerprint` names a code object by what
it does (bytecode, constants, names, local names; not its file, line or function name), so the
runner compares the code an answer reaches, and every code object that runs while it is called,
with the references' fingerprints, which the judge computes from the real references.
"""

from __future__ import annotations

import ast
import hashlib
import types

from . import safe_ast

MARK = "lab-forbidden:"  # in every stub's constants: how the runner knows a stub when it sees one
# what a stubbed class keeps: making and showing an instance (the course builds some at import)
KEEP = frozenset(
    {"__init__", "__new__", "__post_init__", "__init_subclass__", "__set_name__", "__class_getitem__"}
    | {"__repr__", "__eq__", "__hash__", "__getstate__", "__setstate__", "__reduce__"}
)
MIN_CODE_BYTES = 64  # shorter code (`return len(self.free)`) is too generic to identify anything


class UsesReference(Exception):
    """Learner code called, or is, a reference the question forbids (its spec is the message)."""


def _stub_def(name: str, spec: str, indent: str) -> list[str]:
    return [
        f"{indent}def {name}(*args, **kwargs):\n",
        f'{indent}    raise __import__("lab_utils.grading.absent", fromlist=["_"]).UsesReference({MARK + spec!r})\n',
    ]


def stub_source(source: str, targets: dict[str, str]) -> str:
    """`source` with each target (qualified name -> spec) replaced by a stub.

    A function or method keeps its decorators and its name; its body raises. A class keeps its
    bases, decorators, fields and the methods that make an instance (KEEP: a dataclass still holds
    data, and the course builds some at import); every other method it defines raises, and it carries `__lab_forbidden__` so an answer that is or subclasses it is refused.
    """
    tree = safe_ast.parse(source)
    lines = source.splitlines(keepends=True)
    edits: list[tuple[int, int, list[str]]] = []  # (first line index, end index exclusive, text)

    def find(body, path):
        head, rest = path[0], path[1:]
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == head:
                if not rest:
                    yield node
                elif isinstance(node, ast.ClassDef):
                    yield from find(node.body, rest)

    def stub_function(node, spec):
        indent = " " * node.col_offset
        edits.append((node.lineno - 1, node.end_lineno, _stub_def(node.name, spec, indent)))

    for qualname, spec in targets.items():
        nodes = list(find(tree.body, qualname.split(".")))
        if not nodes:
            raise LookupError(f"{spec}: no definition of {qualname!r} in its module's source")
        for node in nodes:
            if isinstance(node, ast.ClassDef):
                inner = " " * (node.body[0].col_offset)
                methods = [
                    n
                    for n in node.body
                    if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name not in KEEP
                ]
                for m in methods:
                    stub_function(m, spec)
                first = node.body[0]
                at = (
                    first.decorator_list[0].lineno if getattr(first, "decorator_list", None) else first.lineno
                ) - 1
                edits.append((at, at, [f"{inner}__lab_forbidden__ = {spec!r}\n"]))
            else:
                stub_function(node, spec)
    for start, end, text in sorted(edits, key=lambda e: (e[0], e[1]), reverse=True):
        lines[start:end] = text
    return "".join(lines)


def stub_spec(obj) -> str | None:
    """The spec of the stub `obj` is (a function, a partial or bound method of one, or a class that
    is or derives from a stubbed class), or None."""
    for _ in range(10):
        if obj is None:
            return None
        if isinstance(obj, type):
            for klass in obj.__mro__:
                spec = vars(klass).get("__lab_forbidden__")
                if isinstance(spec, str):
                    return spec
            return None
        code = getattr(obj, "__code__", None)
        if isinstance(code, types.CodeType):
            for const in code.co_consts:
                if isinstance(const, str) and const.startswith(MARK):
                    return const[len(MARK) :]
            return None
        if isinstance(obj, property):
            obj = obj.fget
            continue
        obj = getattr(obj, "func", None) or getattr(obj, "__func__", None)
    return None


# --- fingerprints ------------------------------------------------------------------------------


def _feed(h, code: types.CodeType, depth: int = 0) -> None:
    h.update(code.co_code)
    h.update(repr((code.co_names, code.co_varnames, code.co_freevars, code.co_cellvars)).encode())
    h.update(repr((code.co_argcount, code.co_kwonlyargcount, code.co_posonlyargcount)).encode())
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            h.update(b"<code>")
            if depth < 20:
                _feed(h, const, depth + 1)
        else:
            h.update(repr((type(const).__name__, const)).encode()[:4096])


def fingerprint(code: types.CodeType) -> str | None:
    """What `code` does, as a short hex string; None for code too short to identify anything."""
    if len(code.co_code) < MIN_CODE_BYTES:
        return None
    h = hashlib.sha256()
    _feed(h, code)
    return h.hexdigest()[:32]


def codes_of(obj) -> list[types.CodeType]:
    """The code objects of a function, of a property's accessors, or of every
    method a class defines (its bases' too, `object` aside); numpy's dispatchers give their
    implementation's."""
    found: list[types.CodeType] = []

    def add(code):  # nested code (a comprehension) is part of its function's fingerprint only
        if isinstance(code, types.CodeType):
            found.append(code)

    def of_function(fn):
        if isinstance(fn, property):
            for f in (fn.fget, fn.fset, fn.fdel):
                of_function(f)
            return
        fn = getattr(fn, "__func__", fn)
        code = getattr(fn, "__code__", None)
        if code is None:
            code = getattr(getattr(fn, "_implementation", None), "__code__", None)
        add(code)

    if isinstance(obj, type):
        for klass in obj.__mro__:
            if klass is object or klass.__module__ == "builtins":
                continue
            for value in vars(klass).values():
                if isinstance(value, (types.FunctionType, property, staticmethod, classmethod)):
                    of_function(value)
    else:
        of_function(obj)
    return found


def reachable_codes(value, budget: int = 20_000) -> list[types.CodeType]:
    """Every code object reachable from an answer: its own code and nested code, and through its
    globals (the names its code uses), closures, defaults, class bodies, partials and bound methods,
    the functions and classes those reach in turn. Modules are not entered."""
    out: list[types.CodeType] = []
    seen: set[int] = set()
    stack = [value]
    while stack and len(seen) < budget:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, types.ModuleType):
            continue
        seen.add(id(obj))
        if isinstance(obj, types.CodeType):
            out.append(obj)
            stack.extend(c for c in obj.co_consts if isinstance(c, types.CodeType))
        elif isinstance(obj, types.FunctionType):
            code = obj.__code__
            stack.append(code)
            glb = obj.__globals__
            names: set[str] = set()
            todo = [code]
            while todo:
                c = todo.pop()
                names.update(c.co_names)
                todo.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
            stack.extend(glb[n] for n in names if n in glb)
            stack.extend(cell.cell_contents for cell in obj.__closure__ or () if _filled(cell))
            stack.extend(obj.__defaults__ or ())
            stack.extend((obj.__kwdefaults__ or {}).values())
        elif isinstance(obj, type):
            if obj.__module__ == "builtins":
                continue
            stack.extend(vars(obj).values())
            stack.extend(b for b in obj.__mro__[1:] if b is not object)
        elif isinstance(obj, (staticmethod, classmethod, types.MethodType)):
            stack.append(obj.__func__)
        elif isinstance(obj, property):
            stack.extend(f for f in (obj.fget, obj.fset, obj.fdel) if f is not None)
        elif isinstance(obj, (list, tuple, set, frozenset)):
            stack.extend(list(obj)[:1000])
        elif isinstance(obj, dict):
            stack.extend(list(obj.values())[:1000])
        else:
            for attr in ("func", "__wrapped__"):  # functools.partial, lru_cache and other wrappers
                inner = getattr(obj, attr, None) if not isinstance(obj, (str, bytes, int, float)) else None
                if callable(inner):
                    stack.append(inner)
    return out


def _filled(cell) -> bool:
    try:
        _ = cell.cell_contents
    except ValueError:
        return False
    return True
