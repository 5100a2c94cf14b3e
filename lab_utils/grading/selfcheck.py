"""A lab's public checks on your own notebook, from a terminal (`make check LAB=NN`).

    python -m lab_utils.grading.selfcheck 02                       # labs/02_*.ipynb
    python -m lab_utils.grading.selfcheck 02 --notebook my_02.ipynb

Runs a copy of the notebook top to bottom in CPU mode with `LIGHT = True` and without starting
servers (`RUN_VLLM = RUN_REAL = False`), then runs every `check(...)` of the lab on what it defined
and prints one line per question. Your notebook file is not changed. These are the public checks the
notebook's own check cells run; the instructor's grader also tries cases you have not seen.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

PARAMETERS = {"BACKEND": "cpu", "LIGHT": True, "RUN_VLLM": False, "RUN_REAL": False, "INTERACTIVE": False}
RESULTS_MARK = "SELFCHECK-RESULTS "


def _notebook_for(lab: str, root: Path) -> Path:
    found = sorted((root / "labs").glob(f"{lab}_*.ipynb"))
    if not found:
        raise SystemExit(f"no labs/{lab}_*.ipynb under {root}")
    return found[0]


def run(lab: str, notebook: Path, timeout_s: float = 900) -> list[dict]:
    """Execute `notebook` (a copy, in memory) and return each question's public-check result."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(str(notebook), as_version=4)
    at = next((i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", [])), -1)
    inject = "\n".join(f"{k} = {v!r}" for k, v in PARAMETERS.items())
    nb.cells.insert(at + 1, nbformat.v4.new_code_cell(inject))
    nb.cells.append(
        nbformat.v4.new_code_cell(
            "import json as _json\n"
            "from lab_utils.grading import questions_for as _qs\n"
            "from lab_utils.grading.scoring import score as _score\n"
            f"print({RESULTS_MARK!r} + _json.dumps([_score(q, globals()).to_dict() for q in _qs({lab!r})]))"
        )
    )
    root = Path(__file__).resolve().parents[2]  # the course folder: the kernel imports this lab_utils
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH")) if p)
    client = NotebookClient(
        nb, timeout=timeout_s, allow_errors=True, resources={"metadata": {"path": str(notebook.parent)}}
    )
    client.execute()
    errors = [
        f"cell {i}: {o.get('ename')}: {str(o.get('evalue'))[:160]}"
        for i, c in enumerate(nb.cells)
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if o.get("output_type") == "error"
    ]
    for line in errors:
        print(f"  (the notebook raised in {line})")
    for out in nb.cells[-1].get("outputs", []):
        text = out.get("text", "")
        if RESULTS_MARK in text:
            return json.loads(text.split(RESULTS_MARK, 1)[1])
    raise SystemExit("the notebook did not reach its end; see the errors above")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("lab", help="two digits, e.g. 02")
    parser.add_argument("--notebook", type=Path, help="default: labs/NN_*.ipynb")
    args = parser.parse_args(argv)
    lab = f"{int(args.lab):02d}"
    notebook = args.notebook or _notebook_for(lab, Path.cwd())
    print(f"lab {lab}: running {notebook} (CPU, LIGHT, no servers)...", flush=True)
    t0 = time.perf_counter()
    results = run(lab, notebook)
    earned = sum(r["earned"] for r in results)
    for r in results:
        hint = f" — {r['message']}" if r.get("message") else ""
        print(f"  {r['id']:32s} {r['status']:14s} {r['earned']:g}/{r['points']:g}{hint}")
    total = sum(r["points"] for r in results)
    print(f"lab {lab}: {earned:g}/{total:g} points on the public checks ({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
