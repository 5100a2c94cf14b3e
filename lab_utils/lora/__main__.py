"""`python -m lab_utils.lora`: train (or find) every course adapter and its merged model, and print where."""

import sys

from . import adapter_info, prepare_all
from .merge import prepare_merged, weight_bytes

if __name__ == "__main__":
    for task, path in prepare_all().items():
        info = adapter_info(task)
        print(
            f"adapter {task}: {path} (rank {info['rank']}, loss {info['final_loss']:.3f}, {info['train_seconds']} s)"
        )
    for task, path in prepare_merged().items():
        print(f"merged {task}: {path} ({weight_bytes(path) / 1e6:.0f} MB of weights)")
    sys.exit(0)
