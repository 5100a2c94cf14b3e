"""Build a "memorised" submission from a solution run, to prove the grade certifies work.

A memorised submission is what a learner who transcribes rather than computes would hand in: every
value typed in from a run of the solution under one seed, every measured object re-typed as a plain
dict, and every answer function replaced by a lookup table of the inputs and outputs the public
checks used. CI grades it under another seed and requires at most a tenth of the points
(`tests/test_notebooks.py`); an author can run it on a new lab's questions the same way:

    answers = memorised_answers("05", load_answers(folder)[0])
    results = [score_graded(q, answers, seed=other) for q in questions_for("05")]

The other bypass students: `imported_answers` (the references themselves), `pasted_answers` (their
source pasted in), `runtime_copy_answers` (their source exec-ed at run time), and
`copied_prediction_answers`.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import sys

from lab_utils.grading import safe_ast
from lab_utils.grading.scoring import score

from .registry import questions_for


class _Recorder:
    """Wraps an answer function and records each call the public checks make."""

    def __init__(self, fn, table: dict):
        self.fn, self.table = fn, table
        functools.update_wrapper(self, fn)

    def __call__(self, *args, **kwargs):
        result = self.fn(*args, **kwargs)
        self.table[_key(args, kwargs)] = result
        return result


def _key(args, kwargs) -> str:
    return repr((args, sorted(kwargs.items())))


def _lookup(name: str, table: dict):
    def memorised(*args, **kwargs):
        key = _key(args, kwargs)
        if key in table:
            return table[key]
        raise KeyError(f"{name}: this input was not among the public check's cases")

    memorised.__name__ = name
    return memorised


def _typed_in(value):
    """A value as a learner would type it in: plain data, no live objects."""
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    if isinstance(value, dict):
        return {k: _typed_in(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return (
            type(value)(_typed_in(v) for v in value)
            if isinstance(value, list)
            else tuple(_typed_in(v) for v in value)
        )
    try:
        return float(value)  # numpy scalars
    except (TypeError, ValueError):
        pass
    try:
        return _typed_in(value.tolist())  # numpy arrays, tensors
    except AttributeError:
        return repr(value)


def memorised_answers(lab: str, answers: dict) -> dict:
    """The memorised submission built from a solution run's saved `answers` (see module doc)."""
    tables: dict[str, dict] = {}
    recorded: dict = {}
    for name, value in answers.items():
        if inspect.isfunction(value) or inspect.ismethod(value):
            tables[name] = {}
            recorded[name] = _Recorder(value, tables[name])
        else:
            recorded[name] = value
    for q in questions_for(lab):
        score(q, recorded)  # fills the tables with the public checks' cases
    out: dict = {}
    for name, value in answers.items():
        if name in tables:
            out[name] = _lookup(name, tables[name])
        elif isinstance(value, type):
            continue  # a class cannot be typed in; it counts as not answered
        else:
            out[name] = _typed_in(value)
    return out


def save_answers(answers: dict, folder) -> None:
    """Save `answers` as the notebook's probe does (one cloudpickle file per name), for the judge."""
    from pathlib import Path

    import cloudpickle

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    module = sys.modules[__name__]
    cloudpickle.register_pickle_by_value(module)  # the sandbox cannot import grader/: ship the code
    try:
        for name, value in answers.items():
            (folder / f"{name}.pkl").write_bytes(cloudpickle.dumps(value))
    finally:
        cloudpickle.unregister_pickle_by_value(module)


# --- the other bypasses CI proves worthless (issue: questions that certify understanding) -------


def _resolve(spec: str):
    import importlib

    module, _, attr = spec.partition(":")
    obj = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def imported_answers(lab: str, answers: dict) -> dict:
    """Every answer a question forbids a reference for *is* that reference, imported under the
    answer's name (the rest memorised): `from lab_utils.x import ref as my_answer`."""
    fake = memorised_answers(lab, answers)
    for q in questions_for(lab):
        refs = [_resolve(spec) for spec in q.forbid]
        for name, ref in zip(q.answers, refs):
            fake[name] = ref
        if refs:
            for name in q.answers[len(refs) :]:
                fake[name] = refs[0]
    return fake


def pasted_answers(lab: str, answers: dict):
    """Every forbidden reference's source pasted in under the answer's name (the rest memorised).

    Returns (answers, notebook): the functions are compiled afresh from the reference's source, as a
    paste into a notebook cell would be, and the notebook holds those cells for the judge's
    syntax-tree comparison."""
    import ast
    import textwrap

    import nbformat

    fake = memorised_answers(lab, answers)
    cells = []
    for q in questions_for(lab):
        for name, spec in zip(q.answers, q.forbid):
            ref = _resolve(spec)
            try:
                src = textwrap.dedent(inspect.getsource(ref))
            except (OSError, TypeError):
                continue
            tree = safe_ast.parse(src)
            top = tree.body[0]
            if isinstance(top, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                top.name = name
                top.decorator_list = []
            code = ast.unparse(tree)
            namespace = dict(vars(sys.modules[ref.__module__]))  # the globals a paste would import
            namespace["__name__"] = "__main__"
            try:
                exec(compile(code, f"<pasted {name}>", "exec"), namespace)
            except Exception:
                continue
            fake[name] = namespace[name]
            cells.append(code)
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    return fake, nb


def runtime_copy_answers(lab: str, answers: dict):
    """Every forbidden reference copied at run time: its module's source read with
    `inspect.getsource` and `exec`-ed in the notebook, the copy then handed in under the answer's
    name (the rest memorised). The notebook holds only the `exec` lines, so the syntax-tree check
    sees no paste: the sandboxed runner must know the copy by its code (lab_utils.grading.absent).

    Returns (answers, notebook) like `pasted_answers`."""
    import textwrap

    import nbformat

    fake = memorised_answers(lab, answers)
    cells = []
    for q in questions_for(lab):
        for name, spec in zip(q.answers, q.forbid):
            ref = _resolve(spec)
            ref = getattr(ref, "fget", None) or ref
            try:
                src = textwrap.dedent(inspect.getsource(ref))
            except (OSError, TypeError):
                continue
            namespace = dict(vars(sys.modules[ref.__module__]))  # the module's globals, as exec(..., vars(m))
            namespace["__name__"] = "__main__"
            try:
                exec(compile(src, f"<runtime copy of {spec}>", "exec"), namespace)
                copy = namespace[ref.__name__]
            except Exception:
                continue
            fake[name] = copy
            module, _, attr = spec.partition(":")
            cells.append(
                f"import importlib, inspect\n_m = importlib.import_module({module!r})\n"
                f"exec(inspect.getsource(_m.{attr}), vars(_m) | {{'__name__': '__main__'}})\n"
                f"{name} = {ref.__name__}"
            )
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    return fake, nb


def copied_prediction_answers(lab: str, answers: dict) -> dict:
    """Each prediction assigned from the measurement of the solution's run (the rest memorised):
    `PREDICTED = MEASURED`. A prediction graded on hidden scenarios gains nothing from it."""
    fake = memorised_answers(lab, answers)
    for q in questions_for(lab):
        if not q.predict:
            continue
        for name in q.answers:
            if name in answers:  # the run's own value, as the measuring cell printed it
                fake[name] = _typed_in(answers[name]) if not callable(answers[name]) else fake[name]
    return fake
