"""Digests of what a grade depends on, for the cache key of a saved grade.

A grade is reused only when nothing it was computed from changed: the student's whole folder
(an `aux.py` beside the notebook included), every file of the course library and of the grader
(the engine, the simulators and every lab's question files, since forbid lists cross labs), the
hidden tests, and the versions of the installed packages. Links are digested as links (their
target text), never followed; FIFOs and devices as their kind, never opened.
"""

from __future__ import annotations

import functools
import hashlib
import os
import stat
from pathlib import Path

SKIP = {"__pycache__", ".pytest_cache", ".ruff_cache"}


def file_digest(path: Path | str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _walk(root: Path, skip_top_notebooks: str | None = None, max_entries: int = 20_000):
    """(relative path, kind, digest) for every entry under root, sorted, links not followed."""
    stack = [root]
    n = 0
    while stack:
        here = stack.pop()
        try:
            entries = sorted(os.scandir(here), key=lambda e: e.name)
        except OSError:
            continue
        for e in entries:
            n += 1
            if n > max_entries:
                yield ("...", "too many entries", "")
                return
            rel = os.path.relpath(e.path, root)
            try:
                st = os.lstat(e.path)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode):
                if e.name not in SKIP:
                    stack.append(Path(e.path))
                continue
            if skip_top_notebooks is not None and here == root and e.name.endswith(".ipynb"):
                if e.name != skip_top_notebooks:
                    continue  # the student's other labs: not part of this grade
            if stat.S_ISLNK(st.st_mode):
                yield (rel, "link", os.readlink(e.path))
            elif stat.S_ISREG(st.st_mode):
                try:
                    yield (rel, "file", file_digest(e.path) if st.st_size < 2**28 else f"size {st.st_size}")
                except OSError as exc:
                    yield (rel, "unreadable", type(exc).__name__)
            else:
                yield (rel, "special", str(stat.S_IFMT(st.st_mode)))


def tree_digest(root: Path) -> str:
    """Every file under a source tree (caches left out)."""
    h = hashlib.sha256()
    for rel, kind, digest in sorted(_walk(root)):
        h.update(f"{rel}\0{kind}\0{digest}\n".encode())
    return h.hexdigest()


def folder_digest(folder: Path, keep: str) -> str:
    """A student's folder as a run sees it: every file, without their other labs' notebooks."""
    h = hashlib.sha256()
    for rel, kind, digest in sorted(_walk(folder, skip_top_notebooks=keep)):
        h.update(f"{rel}\0{kind}\0{digest}\n".encode())
    return h.hexdigest()


@functools.lru_cache(maxsize=1)
def installed_packages() -> str:
    """name==version of every installed distribution, sorted (once per process)."""
    from importlib import metadata

    names = set()
    for dist in metadata.distributions():
        try:
            names.add(f"{dist.metadata['Name']}=={dist.version}")
        except Exception:  # a broken metadata folder names no version
            continue
    return "\n".join(sorted(names))
