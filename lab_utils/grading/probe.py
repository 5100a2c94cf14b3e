"""The probe cell the grader inserts after every code cell of a submission.

It saves the lab's answer variables with cloudpickle into a folder outside the notebook, so a
separate, clean process can check them later. Saving after every cell means a notebook that hangs
or kills its kernel half-way still keeps the answers it had reached.

A prediction is made before it is measured: the answers of a `predict=True` question are frozen
after the cell that checks that question (`check("NN.name")`), or, where the notebook has no such
cell, when they are first saved. Assigning the measurement to the prediction in a later cell
changes nothing the grader sees.
"""

from __future__ import annotations

PROBE_TAG = "grader-probe"

_TEMPLATE = """# inserted by the grader after every cell; not part of the submission
def _lab_grader_probe(_names={names!r}, _folder={folder!r}, _final={final!r}, _freeze={freeze!r}, _first={first!r}):
    import hashlib, os
    try:
        import cloudpickle
    except Exception:
        return
    _g = globals()
    _seen = _g.setdefault("_lab_grader_seen", {{}})
    for _n in _names:
        if _n not in _g:
            continue
        _obj = _g[_n]
        _path = os.path.join(_folder, _n + ".pkl")
        if os.path.exists(_path + ".frozen"):
            continue  # a prediction, already fixed where its check cell stood
        if not _final and _seen.get(_n) == id(_obj) and _n not in _freeze:
            continue
        _seen[_n] = id(_obj)
        try:
            _data = cloudpickle.dumps(_obj)
        except Exception as _exc:
            with open(_path + ".error", "w") as _f:
                _f.write(f"{{type(_exc).__name__}}: {{_exc}}"[:500])
            continue
        _tmp = _path + ".tmp"
        with open(_tmp, "wb") as _f:
            _f.write(_data)
        os.replace(_tmp, _path)
        if os.path.exists(_path + ".error"):
            os.remove(_path + ".error")
        if _n in _freeze or _n in _first:
            open(_path + ".frozen", "w").close()
_lab_grader_probe()
del _lab_grader_probe
"""


def probe_source(
    names: list[str], folder: str, final: bool = False, freeze: list[str] = (), first: list[str] = ()
) -> str:
    """The source of one probe cell saving `names` into `folder`; `freeze`: names fixed after this
    cell; `first`: names fixed when first saved."""
    return _TEMPLATE.format(
        names=list(names), folder=str(folder), final=final, freeze=sorted(freeze), first=sorted(first)
    )


def _checked(source: str) -> set[str]:
    import re

    return set(re.findall(r"check\(\s*[\"'](\d\d\.\w+)[\"']", source))


def instrument(
    nb, names: list[str], folder: str, predictions: dict[str, list[str]] | None = None
) -> list[str]:
    """Insert a probe after every code cell of `nb` (in place), and a final one at the end.

    `predictions` maps a predict question's id to its answer names: they are frozen after the cell
    that checks the question, or at first save where no cell does. Returns the ids of predictions
    whose check cell is missing (for the instructor's summary).
    """
    import nbformat

    predictions = predictions or {}
    code = [c for c in nb.cells if c.cell_type == "code" and PROBE_TAG not in c.metadata.get("tags", [])]
    checked = set().union(*(_checked(c.source) for c in code)) if code else set()
    missing = sorted(q for q in predictions if q not in checked)
    first = sorted({n for q in missing for n in predictions[q]})
    cells = []
    for cell in nb.cells:
        if cell.cell_type == "code" and PROBE_TAG in cell.metadata.get("tags", []):
            continue  # a submission carrying old probes: drop them
        cells.append(cell)
        if cell.cell_type == "code":
            freeze = {n for q in _checked(cell.source) if q in predictions for n in predictions[q]}
            probe = nbformat.v4.new_code_cell(probe_source(names, folder, freeze=freeze, first=first))
            probe.metadata["tags"] = [PROBE_TAG]
            cells.append(probe)
    final = nbformat.v4.new_code_cell(probe_source(names, folder, final=True, first=first))
    final.metadata["tags"] = [PROBE_TAG]
    cells.append(final)
    nb.cells = cells
    return missing


def load_answers(folder) -> tuple[dict, dict[str, str]]:
    """The saved answers in `folder` and, for those that could not be saved or loaded, why."""
    from pathlib import Path

    import cloudpickle

    answers: dict = {}
    problems: dict[str, str] = {}
    for path in sorted(Path(folder).glob("*.pkl")):
        try:
            answers[path.stem] = cloudpickle.loads(path.read_bytes())
        except Exception as exc:
            problems[path.stem] = not_loaded(exc)
    for name, why in not_saved(folder).items():
        problems.setdefault(name, why)
    return answers, problems


def not_loaded(exc: BaseException) -> str:
    return f"could not be loaded: {type(exc).__name__}: {exc}"[:300]


def not_saved(folder) -> dict[str, str]:
    """{name: why} of the answers the probe could not save (.pkl.frozen markers are not answers)."""
    from pathlib import Path

    return {
        path.name[: -len(".pkl.error")]: "could not be saved: " + path.read_text()
        for path in sorted(Path(folder).glob("*.pkl.error"))
    }
