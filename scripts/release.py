"""Build the learner's copy of the course: what an instructor hands a class.

    python scripts/release.py OUT        (or: make release OUT=DIR)

OUT gets the generated labs, the learner side of the library (`lab_utils`, public checks and
scenarios included), the set-up files and a short README; no solutions, no instructor side
(`grader/`: hidden checks, references, judge, gradebook), no tests and no benchmarks. The learner
runs `make lab` and `make check LAB=NN` in it (its Makefile keeps only those and the set-up steps). The build refuses to finish if anything
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
    "scripts/apt_tool.sh",  # `make setup` installs prometheus (lab 12) with it
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
make lab              # .venv and the course model, then JupyterLab in labs/; the rest is built meanwhile
make check LAB=02     # lab 02's public checks on labs/02_*.ipynb, from a terminal (CPU, no servers)
```

The first `make lab` builds the environment and the course model (3 min 4 s from a fresh clone on 2 cores, 2026-12-06), opens JupyterLab,
and builds the rest in the background (the draft model, lab 12's adapters, lab 13's MoE, lab 15's
reasoning model, the Triton environment; a lab whose part is not ready yet says so in its set-up cell
and waits, with the time left). Later runs take seconds.
`python -m lab_utils.setup` reports each step. Every lab's `check("NN.name")` cells give you
immediate feedback on public cases; `make check LAB=NN` runs a copy of your saved notebook (CPU
mode, `LIGHT = True`, no servers started) and prints every question's public result (add
`NB=path/to/notebook.ipynb` for another file). Your instructor grades your saved notebook on cases
you have not seen, so compute your answers from `SCENARIO` and write your own functions.

`Run All` goes to the end even before you have written anything: a cell that needs an answer you
have not written yet prints one line saying what to write, and the rest of the lab still runs.

Requirements: Linux x86-64, Python 3.11, g++, about 15 GB of disk.

## On a remote lab machine

JupyterLab listens on 127.0.0.1 only (port 8888, or `make lab LAB_PORT=9000`), so reach it through
an SSH tunnel from your own computer:

```bash
ssh -L 8888:127.0.0.1:8888 you@lab-machine     # then, on the lab machine: cd this-folder && make lab
```

Open the `http://127.0.0.1:8888/lab?token=...` address `make lab` prints, in your own browser: the
token in it is JupyterLab's password (`.venv/bin/jupyter server list` on the lab machine prints it
again). If port 8888 is taken on your computer, use `-L 9999:127.0.0.1:8888` and open port 9999.
Keep the SSH session open (or run `make lab` in `tmux`) while you work.

The servers the labs start (vLLM, the Triton server, the course engine, the TGI stand-in, the lab 12
gateway and Prometheus) bind 127.0.0.1 on free ports picked when they start, and the notebook talks
to them on the lab machine itself: no tunnel is needed for them. To open one in your browser (say
Prometheus' page in lab 12), tunnel the port the cell prints: `ssh -L 9090:127.0.0.1:PORT ...`.
"""


# the repository's targets that do not work, or do not belong, in a learner's copy: the tests and
# test tools, the GPU check, regenerating labs/ from solutions/, building a release, and the
# grader's sandbox (bubblewrap is the instructor's tool; its install note is for them)
INSTRUCTOR_TARGETS = ("test", "test-fast", "test-tools", "gpu-check", "labs", "release", "sandbox", "hub")
MAKEFILE_HEADER = """# LLM Serving Lab (learner's copy)
#
#   make lab           .venv and the course model, then JupyterLab on 127.0.0.1 in labs/; the rest
#                      of the set-up is built in the background meanwhile (make lab-stop stops it)
#   make check LAB=NN  one lab's public checks on labs/NN_*.ipynb (CPU mode, LIGHT, no servers);
#                      NB=path/to/notebook.ipynb checks another copy
#   make setup         the set-up alone (`python -m lab_utils.setup` reports each step)
#
# GPU lab machine: `make setup GPU=1` installs requirements/course-gpu.txt instead.
"""


def learner_makefile(text: str) -> str:
    """The repository's Makefile without its instructor targets, with a learner's header."""
    paragraphs = text.split("\n\n")
    kept = []
    for para in paragraphs[1:]:  # the first paragraph is the repository's header comment
        rule = next((ln for ln in para.splitlines() if ln and not ln.startswith(("#", ".PHONY"))), "")
        target = rule.split(":", 1)[0].strip()
        if ":" in rule and not rule.startswith((" ", "\t")) and "=" not in rule.split(":", 1)[0]:
            if target in INSTRUCTOR_TARGETS:
                continue
        kept.append(para)
    out = "\n\n".join([MAKEFILE_HEADER.rstrip("\n"), *kept])
    lines = []
    for line in out.splitlines():
        if line.startswith((".PHONY:", "setup:")):
            head, deps = line.split(":", 1)
            line = head + ":" + "".join(f" {d}" for d in deps.split() if d not in INSTRUCTOR_TARGETS)
        lines.append(line)
    return "\n".join(lines) + "\n"


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
    (out / "Makefile").write_text(learner_makefile((REPO / "Makefile").read_text()))
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
