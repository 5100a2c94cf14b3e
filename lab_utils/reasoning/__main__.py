"""python -m lab_utils.reasoning: build lab 15's reasoning model once (nothing to do when cached)."""

import json

from lab_utils.reasoning.build import MARKER, reasoning_dir, reasoning_model_path, reasoning_ready

if reasoning_ready():
    print(f"reasoning model ready in {reasoning_dir()}")
else:
    folder = reasoning_model_path()
    info = json.loads((folder / MARKER).read_text())
    print(json.dumps({k: v for k, v in info.items() if k != "format_quality"}, indent=1))
    print(json.dumps({k: v for k, v in info["format_quality"].items() if k != "samples"}))
