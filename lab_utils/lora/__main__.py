"""`python -m lab_utils.lora`: train (or find) every course adapter and print where it is."""

import sys

from . import adapter_info, prepare_all

if __name__ == "__main__":
    for task, path in prepare_all().items():
        info = adapter_info(task)
        print(
            f"adapter {task}: {path} (rank {info['rank']}, loss {info['final_loss']:.3f}, {info['train_seconds']} s)"
        )
    sys.exit(0)
