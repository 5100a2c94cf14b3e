"""lab_utils: the package the LLM Serving Lab notebooks import.

Nothing heavy happens at import time: torch, vllm, tritonclient and ipywidgets are imported inside
the functions that need them, so `import lab_utils` is instant everywhere.
"""

__version__ = "0.1.0"

import os as _os

if _os.environ.get(
    "LAB_FIGURE_CHECK"
):  # CI: check every figure a notebook shows (lab_utils.viz.figure_check)
    from lab_utils.viz.figure_check import install as _install_figure_check

    _install_figure_check()
