"""python -m lab_utils.draft: build the course draft model once (nothing to do when it is cached)."""

import sys

from lab_utils.draft import draft_info, format_info
from lab_utils.draft.distill import build_draft

build_draft()
print(format_info(draft_info()))
sys.exit(0)
