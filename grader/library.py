"""The course library one question's runner sees: the question's references are not in it.

`library_for(specs)` writes a copy of `lab_utils` in which every course reference the question
forbids is a stub that raises (`lab_utils.grading.absent.stub_source`), compiled, and cached for
the life of the grader process. The judge binds that copy over the course library inside the
runner's sandbox (unsandboxed, it goes first on the runner's path), so the reference is absent at
source level: no closure, no `inspect.getsource`, no reload and no `.pyc` gives it back.

`fingerprints(q)` names, by code fingerprint, what the runner must never see run: the question's
references (course and third-party) and the grader's own hidden references for that question.
"""

from __future__ import annotations

import atexit
import compileall
import hashlib
import importlib
import inspect
import json
import os
import shutil
import tempfile
import threading
import types
from pathlib import Path

from lab_utils.grading import safe_ast
from lab_utils.grading.absent import codes_of, fingerprint, stub_source

REPO = Path(__file__).resolve().parent.parent
LIBRARY = REPO / "lab_utils"
_CACHE: dict[str, Path] = {}
_ROOT: Path | None = None


def resolve(spec: str):
    """The object "module:attr.attr" names (properties as themselves)."""
    module_name, _, attr = spec.partition(":")
    obj = importlib.import_module(module_name)
    for part in attr.split(".") if attr else []:
        owner = obj
        obj = inspect.getattr_static(owner, part) if isinstance(owner, type) else getattr(owner, part)
        if isinstance(obj, (staticmethod, classmethod)):
            obj = obj.__func__
    return obj


def _definition(spec: str) -> tuple[Path, str] | None:
    """(source file under lab_utils, qualified name) where a course reference is defined."""
    if not spec.startswith("lab_utils"):
        return None
    obj = resolve(spec)
    target = obj.fget if isinstance(obj, property) else obj
    module = importlib.import_module(target.__module__)
    path = Path(inspect.getsourcefile(module)).resolve()
    if LIBRARY not in path.parents:
        return None
    return path, target.__qualname__


def _root() -> Path:
    """The process's folder of library copies: readable by the sandbox's unprivileged user (it
    holds nothing secret: the course library and hashes), removed at exit."""
    global _ROOT
    if _ROOT is None:
        _sweep_stale()
        _ROOT = Path(tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-"))
        _ROOT.chmod(0o755)
        atexit.register(shutil.rmtree, _ROOT, True)
    return _ROOT


_PREFIX = "lab-grader-libraries-"


def _sweep_stale() -> None:
    """Remove the copies of grader processes that died without their exit handlers (killed)."""
    for folder in Path(tempfile.gettempdir()).glob(f"{_PREFIX}*"):
        pid = folder.name[len(_PREFIX) :].split("-", 1)[0]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(folder, ignore_errors=True)
        except PermissionError:
            pass


def prints_file(prints: dict[str, str]) -> Path:
    """`prints` written where a sandboxed runner can read it (a file per distinct set)."""
    data = json.dumps(prints, sort_keys=True)
    path = _root() / f"prints-{hashlib.sha256(data.encode()).hexdigest()[:16]}.json"
    if not path.exists():  # two workers may write the same set at once: each its own temporary
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.stem, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            f.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    return path


def _library_digest() -> str:
    h = hashlib.sha256()
    for path in sorted(LIBRARY.rglob("*.py")):
        h.update(str(path.relative_to(LIBRARY)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def library_for(specs) -> Path | None:
    """A folder holding a `lab_utils` without the course references among `specs` (None when none
    of them is a course reference). Thread-safe: the grader's workers share the copies."""
    with _BUILD_LOCK:
        return _library_for(specs)


_BUILD_LOCK = threading.Lock()  # two workers building one copy would share its .tmp folder


def _library_for(specs) -> Path | None:
    targets: dict[Path, dict[str, str]] = {}
    for spec in specs:
        where = _definition(spec)
        if where is not None:
            path, qualname = where
            targets.setdefault(path, {})[qualname] = spec
    for names in targets.values():  # a method of a class that is stubbed whole is stubbed with it
        for qualname in [n for n in names if any(n.startswith(other + ".") for other in names)]:
            del names[qualname]
    if not targets:
        return None
    key = hashlib.sha256(repr((_library_digest(), sorted(map(str, specs)))).encode()).hexdigest()[:16]
    if key in _CACHE and _CACHE[key].exists():
        return _CACHE[key]
    dest = _root() / key
    tmp = _root() / f"{key}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(LIBRARY, tmp / "lab_utils", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for path, names in targets.items():
        copy = tmp / "lab_utils" / path.relative_to(LIBRARY)
        copy.write_text(stub_source(path.read_text(), names))
    compileall.compile_dir(str(tmp / "lab_utils"), quiet=1, workers=1)
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    _CACHE[key] = dest
    return dest


# --- fingerprints ------------------------------------------------------------------------------


def _hidden_codes(qid: str) -> list[types.CodeType]:
    """Code of the grader's hidden references for question `qid`: every function of the hidden
    module that its hidden check reaches by name (the check itself aside)."""
    from .registry import hidden_check

    check = hidden_check(qid)
    if check is None:
        return []
    module = getattr(check, "__module__", "")
    found, seen, todo = [], set(), [check]
    while todo:
        fn = todo.pop()
        code = getattr(fn, "__code__", None)
        if code is None or id(fn) in seen:
            continue
        seen.add(id(fn))
        if fn is not check:
            found.extend(codes_of(fn))
        names, stack = set(), [code]
        while stack:
            c = stack.pop()
            names.update(c.co_names)
            stack.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
        for name in names:
            value = fn.__globals__.get(name)
            if isinstance(value, type) and value.__module__ == module:
                found.extend(codes_of(value))
            elif isinstance(value, types.FunctionType) and value.__module__ == module:
                todo.append(value)
    return found


HIDDEN_LABEL = "hidden"  # what the runner says of a copy of a hidden reference: never its name


_SOLUTION_PRINTS: dict[str, set[str]] = {}


def solution_prints(lab: str) -> set[str]:
    """Fingerprints of every function the published solution of `lab` defines (compiled, not run).
    The solution is public: code equal to it is the copy check's business (grader.originality), so
    a reference (a hidden check's helper, say) that happens to be written the same way is not one
    the runner refuses."""
    if lab in _SOLUTION_PRINTS:
        return _SOLUTION_PRINTS[lab]
    import ast

    import nbformat

    found: set[str] = set()
    for path in sorted((REPO / "solutions").glob(f"{lab}_*.ipynb")):
        for cell in nbformat.read(str(path), as_version=4).cells:
            if cell.cell_type != "code":
                continue
            src = safe_ast.without_magics(cell.source)
            try:
                tree = safe_ast.parse(src)
            except SyntaxError:
                continue
            defs = [
                n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            ]
            try:
                todo = [safe_ast.compile_tree(ast.Module(defs, []), "<solution>", "exec")]
            except (SyntaxError, ValueError):
                continue
            while todo:
                code = todo.pop()
                fp = fingerprint(code)
                if fp:
                    found.add(fp)
                todo.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
    _SOLUTION_PRINTS[lab] = found
    return found


def fingerprints(q) -> dict[str, str]:
    """{fingerprint: spec} of the question's references, and {fingerprint: "hidden"} of the grader's
    own references for it; none that the published solution's own code has."""
    prints: dict[str, str] = {}
    for spec in q.forbid:
        try:
            obj = resolve(spec)
        except Exception:
            continue
        for code in codes_of(obj):
            fp = fingerprint(code)
            if fp:
                prints.setdefault(fp, spec)
    for code in _hidden_codes(q.id):
        fp = fingerprint(code)
        if fp:
            prints.setdefault(fp, HIDDEN_LABEL)
    public = solution_prints(q.lab)
    return {fp: spec for fp, spec in prints.items() if fp not in public}
