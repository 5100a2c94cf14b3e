"""Published config.json values of today's MoE models (the fields the calculator reads, and a few more).

Read from each model's config.json on the Hugging Face Hub: mistralai/Mixtral-8x7B-v0.1,
Qwen/Qwen3-30B-A3B, Qwen/Qwen3-235B-A22B, deepseek-ai/DeepSeek-V3, openai/gpt-oss-20b and -120b.
"""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).parent
NAMES = sorted(p.stem for p in HERE.glob("*.json"))


def load_config(name: str) -> dict:
    """The config dict of `name` (one of NAMES)."""
    path = HERE / f"{name}.json"
    if not path.is_file():
        raise ValueError(f"no MoE config named {name!r}; the course has {NAMES}")
    return json.loads(path.read_text())
