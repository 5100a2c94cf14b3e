"""lab_utils: the package the LLM Serving Lab notebooks import.

Nothing heavy happens at import time: torch, vllm, tritonclient and ipywidgets are imported inside
the functions that need them, so `import lab_utils` is instant everywhere.
"""

__version__ = "0.1.0"
