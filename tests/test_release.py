"""The learner's copy (`make release OUT=DIR`): labs, the learner side of the library and the set-up
files; no solutions, no instructor side; the public checks work inside it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CHECKS = """
import lab_utils, pathlib, sys
assert pathlib.Path(lab_utils.__file__).resolve().is_relative_to(pathlib.Path.cwd().resolve()), lab_utils.__file__
from lab_utils.grading import check, questions_for
try:
    import grader.judge
    sys.exit("the instructor side is importable from the learner's copy")
except ImportError:
    pass
def extra_tensor_bytes(prompt, new, width=8):
    return 2 * width * (prompt + new)
good = check("07.extra_tensor_bytes", {"extra_tensor_bytes": extra_tensor_bytes})
bad = check("07.extra_tensor_bytes", {"extra_tensor_bytes": lambda p, n, b=8: 1})
print("RESULT", good.status, "|", bad.status, "|", len(questions_for("07")))
"""


def test_the_learners_copy_has_no_solutions_and_its_checks_work(tmp_path):
    out = tmp_path / "class"
    subprocess.run([sys.executable, str(REPO / "scripts" / "release.py"), str(out)], check=True, cwd=tmp_path)
    assert (out / "labs").is_dir() and (out / "lab_utils" / "grading" / "questions").is_dir()
    for gone in ("solutions", "grader", "tests", "bench", ".git"):
        assert not (out / gone).exists(), gone
    text = "\n".join(p.read_text(errors="replace") for p in out.rglob("*") if p.suffix in (".py", ".ipynb"))
    assert "### BEGIN SOLUTION" not in "\n".join(p.read_text() for p in (out / "labs").glob("*.ipynb"))
    assert "@hidden(" not in text and "from grader" not in text
    assert sorted(p.name for p in (out / "labs").glob("*.ipynb")) == sorted(
        p.name for p in (REPO / "solutions").glob("[0-9][0-9]_*.ipynb")
    )
    # `make lab` is there, as in the full repository (dry run: nothing is installed)
    dry = subprocess.run(["make", "-n", "lab"], cwd=out, capture_output=True, text=True)
    assert dry.returncode == 0 and "jupyter lab" in dry.stdout, dry.stdout + dry.stderr
    # the public checks run from the copy's own library, with the instructor side out of reach
    # -S: site-packages without this checkout's editable install (which maps lab_utils and grader here),
    # as in the class's own environment built from the copy
    import sysconfig

    path = f"{out}:{sysconfig.get_paths()['purelib']}"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": path, "MPLBACKEND": "Agg"}
    run = subprocess.run(
        [sys.executable, "-S", "-c", CHECKS], cwd=out, env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "RESULT correct | not yet right | " in run.stdout, run.stdout


CHECKED_LAB = "11"  # the lab whose stub `make check` runs for real in the learner's copy
ADVERTISED = re.compile(r"(?:^|`|#\s+)make ([a-z][a-z-]*)", re.M)  # a command, not prose ("make skips it")


def test_the_learners_copy_advertises_only_targets_that_work_there(tmp_path):
    """README and Makefile name `make lab` and `make check LAB=NN`; each works in the copy (lab as a dry
    run, check for real on the stub of lab 11, which starts no server and runs in about 11 s where lab
    02's stub takes 94 s; selfcheck is the same code for every lab), instructor targets are gone."""
    out = tmp_path / "class"
    subprocess.run([sys.executable, str(REPO / "scripts" / "release.py"), str(out)], check=True, cwd=tmp_path)
    readme, makefile = (out / "README.md").read_text(), (out / "Makefile").read_text()
    advertised = set(ADVERTISED.findall(readme)) | set(ADVERTISED.findall(makefile))
    assert {"lab", "check"} <= advertised <= {"lab", "check", "setup"}, advertised
    assert "ssh -L" in readme and "token" in readme, "the remote lab machine section is missing"
    for gone in ("test", "test-fast", "test-tools", "gpu-check", "release", "labs", "sandbox"):
        assert not re.search(rf"^{gone}:", makefile, re.M), (
            f"make {gone} is still a target in the learner's copy"
        )
    for target in sorted(advertised):
        dry = subprocess.run(
            ["make", "-n", target, f"LAB={CHECKED_LAB}"], cwd=out, capture_output=True, text=True
        )
        assert dry.returncode == 0, f"make -n {target}: {dry.stdout}{dry.stderr}"
    assert (
        "--no-sandbox"  # the grader's install note is the instructor's
        not in subprocess.run(["make", "-n", "setup"], cwd=out, capture_output=True, text=True).stdout
    ), "an instructor note in the learner's set-up"
    # make check for real, with this checkout's environment (its stamp kept as it is: nothing installs)
    venv = REPO / ".venv"
    stamp = next(venv.glob(".installed-*"), None)
    if stamp is None:
        pytest.skip("no course environment here")
    run = subprocess.run(
        ["make", "-o", str(stamp), "check", f"LAB={CHECKED_LAB}", f"VENV={venv}", f"STAMP={stamp}"],
        cwd=out,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert f"lab {CHECKED_LAB}: 0/" in run.stdout and "points on the public checks" in run.stdout, run.stdout[
        -3000:
    ]
    assert "raised in" not in run.stdout, run.stdout[-3000:]
