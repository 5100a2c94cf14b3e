"""Check every figure a notebook shows: LAB_FIGURE_CHECK=FILE appends one JSON line per figure.

Installed by `import lab_utils` (any lab's set-up cell) when the variable names a file and the code
runs in an IPython kernel; with the variable unset nothing is imported and nothing is hooked.

Two places see a notebook's figures, whatever the matplotlib backend:

- the kernel's display formatter: `display(fig)`, a Figure as a cell's value, and the inline
  backend's `plt.show()` and end-of-cell flush all format the Figure there; it is checked just
  before it is rendered;
- after each cell (IPython's post_execute event), the pyplot figures still open that were not
  checked yet: under a non-interactive backend (the grader's MPLBACKEND=Agg) `plt.show()` draws
  nothing, but a learner in JupyterLab sees those figures inline.

Each figure is checked with `readable.problems(fig, cropped=True)` (the inline display crops to what
is drawn) and gives one line: {"notebook", "cell" (execution count), "source" (the cell's first
line), "figure" (its suptitle or first title), "how", "problems", "error"}. A check that raises is
recorded as "error" and the figure is still shown; the hook never stops a display or a cell.
"""

from __future__ import annotations

import json
import os
import sys
import weakref

__all__ = ["ENV", "install", "check_figure"]

ENV = "LAB_FIGURE_CHECK"

_installed: dict = {}  # id(shell) -> the hook state, so a second import installs nothing


def _title(fig) -> str:
    suptitle = getattr(fig, "_suptitle", None)
    if suptitle is not None and suptitle.get_text().strip():
        return suptitle.get_text().strip()
    for ax in fig.axes:
        for loc in ("center", "left", "right"):
            if ax.get_title(loc=loc).strip():
                return ax.get_title(loc=loc).strip()
    return ""


def check_figure(fig) -> tuple[list[str], str | None]:
    """`readable.problems(fig, cropped=True)` and the error it raised, if any (then no problems)."""
    try:
        from lab_utils.viz.readable import problems

        return problems(fig, cropped=True), None
    except Exception as exc:  # noqa: BLE001 - a broken check is recorded, never raised into the notebook
        return [], f"{type(exc).__name__}: {exc}"[:500]


def _first_line(source: str) -> str:
    lines = [ln.strip() for ln in (source or "").splitlines() if ln.strip()]
    code = [ln for ln in lines if not ln.startswith("#")]
    return ((code or lines or [""])[0])[:100]


class _Hook:
    def __init__(self, shell, path: str, notebook: str | None):
        self.shell = shell
        self.path = path
        self.notebook = notebook
        self.cell = None
        self.source = ""
        self.seen_in_cell: set[int] = set()
        self.pending: list[dict] = []  # this cell's lines, written once its execution count is known
        self.checked = weakref.WeakSet()  # figures already checked (open pyplot figures persist under Agg)

    # --- IPython events --------------------------------------------------------------------------
    def pre_run_cell(self, info=None) -> None:
        self.flush()  # figures shown between cells (a widget's callback) go under the cell before
        self.source = _first_line(getattr(info, "raw_cell", "") or "")
        self.seen_in_cell = set()

    def post_run_cell(self, result=None) -> None:
        # IPython 9 counts the cell before pre_run_cell, older versions after it: the result knows
        count = getattr(result, "execution_count", None)
        if count is not None:
            self.cell = count
        self.flush()

    def flush(self) -> None:
        lines, self.pending = self.pending, []
        if not lines:
            return
        try:
            with open(self.path, "a", encoding="utf-8") as f:
                for line in lines:
                    f.write(json.dumps({**line, "cell": self.cell}) + "\n")
        except OSError:
            pass

    def post_execute(self) -> None:
        try:
            if "matplotlib.pyplot" not in sys.modules:
                return
            from matplotlib._pylab_helpers import Gcf

            for manager in list(Gcf.get_all_fig_managers()):
                fig = manager.canvas.figure
                if fig not in self.checked:
                    self.check(fig, "open at the end of the cell")
        except Exception:  # noqa: BLE001 - never break the kernel's cell
            pass

    # --- the display formatter -------------------------------------------------------------------
    def wrap_format(self, original):
        def format(obj, include=None, exclude=None):
            try:
                figure = sys.modules.get("matplotlib.figure")
                if figure is not None and isinstance(obj, figure.Figure) and id(obj) not in self.seen_in_cell:
                    self.check(obj, "displayed")
            except Exception:  # noqa: BLE001 - the display goes on
                pass
            return original(obj, include=include, exclude=exclude)

        format.__wrapped__ = original
        return format

    def check(self, fig, how: str) -> None:
        self.seen_in_cell.add(id(fig))
        self.checked.add(fig)
        found, error = check_figure(fig)
        try:
            title = _title(fig)
        except Exception:  # noqa: BLE001
            title = ""
        self.pending.append(
            {
                "notebook": self.notebook,
                "cell": self.cell,
                "source": self.source,
                "figure": title,
                "how": how,
                "problems": found,
                "error": error,
            }
        )


def install(path: str | None = None, shell=None, notebook: str | None = None) -> bool:
    """Hook the running IPython shell (or `shell`) so every figure it shows is checked into `path`
    (default: $LAB_FIGURE_CHECK). False, and nothing hooked, outside IPython or without a path."""
    path = path or os.environ.get(ENV)
    if not path:
        return False
    if shell is None:
        ipython = sys.modules.get("IPython")
        shell = ipython.get_ipython() if ipython is not None else None
    if shell is None:
        return False
    if id(shell) in _installed:
        return True
    notebook = notebook or os.environ.get("LAB_FIGURE_NOTEBOOK") or os.environ.get("JPY_SESSION_NAME")
    hook = _Hook(shell, path, notebook)
    hook.cell = getattr(shell, "execution_count", None)
    shell.events.register("pre_run_cell", hook.pre_run_cell)
    shell.events.register("post_execute", hook.post_execute)
    shell.events.register("post_run_cell", hook.post_run_cell)
    shell.display_formatter.format = hook.wrap_format(shell.display_formatter.format)
    _installed[id(shell)] = hook
    return True
