"""The probe cell the grader inserts after every code cell of a submission.

It saves the lab's answer variables with cloudpickle into a folder outside the notebook, so a
separate, clean process can check them later. Saving after every cell means a notebook that hangs
or kills its kernel half-way still keeps the answers it had reached.
"""

from __future__ import annotations

PROBE_TAG = "grader-probe"

_TEMPLATE = """# inserted by the grader after every cell; not part of the submission
def _lab_grader_probe(_names={names!r}, _folder={folder!r}, _final={final!r}):
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
        if not _final and _seen.get(_n) == id(_obj):
            continue
        _seen[_n] = id(_obj)
        _path = os.path.join(_folder, _n + ".pkl")
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
_lab_grader_probe()
del _lab_grader_probe
"""


def probe_source(names: list[str], folder: str, final: bool = False) -> str:
    """The source of one probe cell saving `names` into `folder`."""
    return _TEMPLATE.format(names=list(names), folder=str(folder), final=final)


def instrument(nb, names: list[str], folder: str) -> None:
    """Insert a probe after every code cell of `nb` (in place), and a final one at the end."""
    import nbformat

    cells = []
    for cell in nb.cells:
        if cell.cell_type == "code" and PROBE_TAG in cell.metadata.get("tags", []):
            continue  # a submission carrying old probes: drop them
        cells.append(cell)
        if cell.cell_type == "code":
            probe = nbformat.v4.new_code_cell(probe_source(names, folder))
            probe.metadata["tags"] = [PROBE_TAG]
            cells.append(probe)
    final = nbformat.v4.new_code_cell(probe_source(names, folder, final=True))
    final.metadata["tags"] = [PROBE_TAG]
    cells.append(final)
    nb.cells = cells


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
            problems[path.stem] = f"could not be loaded: {type(exc).__name__}: {exc}"[:300]
    for path in sorted(Path(folder).glob("*.pkl.error")):
        problems.setdefault(path.name[: -len(".pkl.error")], "could not be saved: " + path.read_text())
    return answers, problems
