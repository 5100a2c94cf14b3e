"""The learner's own measurements, kept in one results file that lab 11 reads back.

Every lab ends with a "what you measured" table: `measured_table("05", rows)` shows it and records
each figure in `$COURSE_CACHE/results.json` (default `~/.cache/llm-serving-lab/results.json`).

Schema (version 1):

    {"version": 1,
     "labs": {"05": {"ttft_p50_s": {"value": 0.41, "predicted": 0.35, "unit": "s",
                                     "quantity": "TTFT p50 at 8 concurrent", "mode": "cpu",
                                     "recorded": "2026-12-01T03:40:00Z"}, ...}, ...}}

Recording never fails a lab: an unwritable cache prints a note and the table is still shown.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
from pathlib import Path

SCHEMA_VERSION = 1


def results_path() -> Path:
    """Where the results file lives (`LAB_RESULTS_FILE` overrides; graders point it elsewhere)."""
    override = os.environ.get("LAB_RESULTS_FILE")
    if override:
        return Path(override)
    from .models import cache_dir

    return cache_dir() / "results.json"


def load_results(path: Path | None = None) -> dict:
    """The recorded results: {lab: {name: {"value", "predicted", "unit", "quantity", ...}}}."""
    path = path or results_path()
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("version") != SCHEMA_VERSION:
        return {}
    labs = data.get("labs", {})
    return labs if isinstance(labs, dict) else {}


def _key(quantity: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", quantity.lower()).strip("_")[:60] or "value"


def record(
    lab: str, quantity: str, value, unit: str = "", predicted=None, mode: str = "", path: Path | None = None
) -> bool:
    """Record one measured figure for `lab`; returns False (and says why) if it could not be saved."""
    lab = str(lab).zfill(2)
    path = Path(path or results_path())
    entry = {
        "quantity": quantity,
        "value": _plain(value),
        "predicted": _plain(predicted),
        "unit": unit,
        "mode": mode,
        "recorded": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            data = json.loads(path.read_text())
            if not isinstance(data, dict) or data.get("version") != SCHEMA_VERSION:
                raise ValueError
        except (OSError, ValueError):
            data = {"version": SCHEMA_VERSION, "labs": {}}
        data.setdefault("labs", {}).setdefault(lab, {})[_key(quantity)] = entry
        fd, tmp = tempfile.mkstemp(prefix=".results.", dir=path.parent)
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1)
        os.replace(tmp, path)
        return True
    except Exception as exc:  # recording is a courtesy; it must never fail a lab
        print(f"note: could not record {quantity!r} in {path}: {exc}")
        return False


def _plain(value):
    if value is None or isinstance(value, (str, bool, int)):
        return value
    try:
        return float(value)
    except (TypeError, ValueError):
        return str(value)


def _fmt(value) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


class MeasuredTable(str):
    """The table's Markdown; shown once by measured_table, not echoed again as a cell's value."""

    def _ipython_display_(self) -> None:
        pass


def measured_table(lab: str, rows, mode: str = "", record_results: bool = True) -> MeasuredTable:
    """Show (and record) a lab's closing "what you measured" table.

    Args:
        lab: the lab number, "05".
        rows: (quantity, predicted or None, measured, unit) tuples, in the order to show.
    Returns:
        the table as Markdown (also displayed in a notebook).
    """
    lines = ["| what | you predicted | you measured | unit |", "|---|---|---|---|"]
    for row in rows:
        quantity, predicted, measured, unit = (list(row) + [None, None, None, ""])[:4]
        lines.append(f"| {quantity} | {_fmt(_plain(predicted))} | {_fmt(_plain(measured))} | {unit or ''} |")
        if record_results:
            record(lab, str(quantity), measured, unit or "", predicted=predicted, mode=mode)
    text = MeasuredTable("\n".join(lines))
    try:
        from IPython import get_ipython
        from IPython.display import Markdown, display

        if get_ipython() is not None:
            display(Markdown(text))
            return text
    except ImportError:
        pass
    print(text)
    return text
