"""Lab 15's reasoning model: the course model fine-tuned to think in `<think>` tags and call tools.

`reasoning_model_path()` builds it on first use (`python -m lab_utils.reasoning`); `build_info()`
says what the build measured. `data` makes the examples, `template` holds the chat template.
"""

from .build import build_info, reasoning_dir, reasoning_model_path, reasoning_ready

__all__ = ["build_info", "reasoning_dir", "reasoning_model_path", "reasoning_ready"]
