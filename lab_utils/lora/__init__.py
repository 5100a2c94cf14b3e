"""LoRA adapters for the course model, trained by the course itself (peft, CPU, no hub download).

data (the generated training sets and how to check an answer's form), train (training, the cache).
merge (one adapter merged into a full copy of the weights, cached beside them), bench (a batch
spread over k adapters, and a server's memory).
"""

from .data import HELD_OUT, TASKS, follows, prompt
from .train import adapter_info, adapter_path, adapters_dir, all_prepared, generate, prepare_all

__all__ = [
    "HELD_OUT",
    "TASKS",
    "adapter_info",
    "adapter_path",
    "adapters_dir",
    "all_prepared",
    "follows",
    "generate",
    "prepare_all",
    "prompt",
]
