"""Build the learner's copy of the course: what an instructor hands a class.

    python scripts/release.py OUT        (or: make release OUT=DIR)

OUT gets the generated labs, the learner side of the library (`lab_utils`, public checks and
scenarios included), the set-up files and a short README; no solutions, no instructor side
(`grader/`: hidden checks, references, judge, gradebook), no tests and no benchmarks. The learner
runs `make lab` in it exactly as in the full repository. The build refuses to finish if anything
of the instructor's side slipped in.
"""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
KEEP = [
    "labs",
    "lab_utils",
    "requirements",
    "docker",
    "scripts/install_course_env.sh",
    "scripts/triton_env.sh",
    "scripts/apt_tool.sh",  # `make setup` installs bubblewrap and prometheus with it
    "Makefile",
    "pyproject.toml",
    "environment.yml",
    ".gitignore",
]
IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", ".ipynb_checkpoints")
# what must never be in a learner's copy
LEAKS = [
    (re.compile(r"### BEGIN SOLUTION"), "a solution block"),
    (re.compile(r"^\s*(from grader|import grader)\b", re.M), "an import of the instructor side"),
    (re.compile(r"^@hidden\(", re.M), "a hidden check"),
]

README = """# LLM Serving Lab (learner's copy)

```bash
make lab    # set-up (.venv, course model, Triton server environment), then JupyterLab in labs/
```

The first run installs everything (a few minutes and a few GB); later runs take seconds.
`python -m lab_utils.setup` reports each step. Every lab's `check("NN.name")` cells give you
immediate feedback on public cases; your instructor grades your saved notebook on cases you have
not seen, so compute your answers from `SCENARIO` and write your own functions.

Requirements: Linux x86-64, Python 3.11, g++, about 15 GB of disk.
"""


def build(out: Path) -> list[Path]:
    """Write the learner's copy into `out` (which must not exist or be empty); returns its files."""
    out = out.resolve()
    if out.exists() and any(out.iterdir()):
        raise SystemExit(f"error: {out} is not empty; give a new folder")
    if out == REPO or REPO in out.parents and out.parent == REPO:
        raise SystemExit("error: build the release outside the repository")
    out.mkdir(parents=True, exist_ok=True)
    for rel in KEEP:
        src = REPO / rel
        dest = out / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dest, ignore=IGNORE)
        elif src.exists():
            shutil.copy2(src, dest)
    (out / "README.md").write_text(README)
    files = [p for p in out.rglob("*") if p.is_file()]
    problems = []
    for p in files:
        if (
            p.suffix not in (".py", ".ipynb", ".md", ".txt", ".toml", ".sh", ".yml", ".yaml")
            and p.name != "Makefile"
        ):
            continue
        text = p.read_text(errors="replace")
        for pattern, what in LEAKS:
            if what == "a solution block" and p.suffix != ".ipynb":
                continue  # lab_utils/nbgen.py names the marker it strips
            if pattern.search(text):
                problems.append(f"{p.relative_to(out)}: {what}")
    if (out / "grader").exists() or (out / "solutions").exists():
        problems.append("an instructor folder (grader/ or solutions/)")
    if problems:
        shutil.rmtree(out, ignore_errors=True)
        raise SystemExit("error: the learner's copy would leak:\n  " + "\n  ".join(problems))
    return files


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    files = build(Path(argv[0]))
    print(f"learner's copy: {len(files)} files in {Path(argv[0]).resolve()} (no solutions, no grader)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
