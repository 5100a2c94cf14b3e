"""The learner's copy a sandboxed run sees: `make release`'s output, built once and cached by digest.

A run of learner code never sees the repository. It sees the course exactly as a learner would
have it (scripts/release.py: labs, the learner side of lab_utils, set-up files; no solutions, no
grader, no tests, no history), built into `<course cache>/learner-copy/<digest>` the first time a
grader needs it and reused while the files it is built from are unchanged. The folder is bound
read-only at its own path inside the sandbox, and `LAB_REPO_ROOT` and `PYTHONPATH` point at it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import tempfile
import threading
from pathlib import Path

from .fingerprint import file_digest, tree_digest

REPO = Path(__file__).resolve().parent.parent
_LOCK = threading.Lock()
_BUILT: dict[str, Path] = {}


def _release_module():
    spec = importlib.util.spec_from_file_location("_course_release", REPO / "scripts" / "release.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _digest(keep: list[str]) -> str:
    """What the learner's copy is built from: every kept file of the repository."""
    h = hashlib.sha256(b"learner-copy 1\n")
    for rel in keep:
        path = REPO / rel
        if path.is_dir():
            h.update(f"{rel}\0dir\0{tree_digest(path)}\n".encode())
        elif path.is_file():
            h.update(f"{rel}\0file\0{file_digest(path)}\n".encode())
    h.update(file_digest(REPO / "scripts" / "release.py").encode())
    return h.hexdigest()[:20]


def copies_root() -> Path:
    from lab_utils.models import cache_dir

    return Path(cache_dir()) / "learner-copy"


def learner_copy() -> Path:
    """The folder holding the learner's copy of the course as it is now (built on first use)."""
    release = _release_module()
    digest = _digest(list(release.KEEP))
    with _LOCK:
        if digest in _BUILT and _BUILT[digest].is_dir():
            return _BUILT[digest]
        root = copies_root()
        dest = root / digest
        if not (dest / ".complete").is_file():
            root.mkdir(parents=True, exist_ok=True)
            os.chmod(root, 0o755)
            staging = Path(tempfile.mkdtemp(prefix=f".{digest}-", dir=root))
            try:
                release.build(staging / "copy")
                (staging / "copy" / ".complete").write_text(digest + "\n")
                _open_for_reading(staging / "copy")
                try:
                    os.rename(staging / "copy", dest)  # another grader may have won the race
                except OSError:
                    if not (dest / ".complete").is_file():
                        raise
            finally:
                shutil.rmtree(staging, ignore_errors=True)
        _BUILT[digest] = dest
        return dest


def _open_for_reading(top: Path) -> None:
    """Every user may read the copy (the sandbox's unprivileged uid runs from it); nobody writes."""
    for dirpath, _dirs, filenames in os.walk(top):
        os.chmod(dirpath, 0o755)
        for name in filenames:
            p = os.path.join(dirpath, name)
            if not os.path.islink(p):
                os.chmod(p, 0o755 if os.access(p, os.X_OK) else 0o644)
