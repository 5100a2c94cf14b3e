"""What a run leaves behind, read as hostile data: files checked before they are opened, text made
plain before it reaches a console, the gradebook or a feedback file.

A learner's code writes the status file, the answers, the executed notebook and the logs. Any of
them may be a FIFO (an open would wait forever), a link (to a file the grader may read and the
learner may not), a sparse file of 64 GiB (a read would exhaust memory) or text with terminal
escapes, bare carriage returns and HTML. `read_bytes` refuses all but a small regular file, and
never blocks; `plain`, `markdown_text` and `csv_cell` print a learner's string as data.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

MAX_STATUS_BYTES = 64 * 2**10
MAX_NOTEBOOK_BYTES = 64 * 2**20


class Refused(OSError):
    """A file a run left that the grader will not read (its reason is the message)."""


def read_bytes(path: Path | str, limit: int) -> bytes:
    """The bytes of a regular file of at most `limit` bytes, never following a link and never
    waiting on a FIFO or a device; `Refused` (an OSError) otherwise."""
    path = str(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise
    if stat.S_ISLNK(st.st_mode):
        raise Refused(f"{os.path.basename(path)} is a symbolic link")
    if not stat.S_ISREG(st.st_mode):
        raise Refused(f"{os.path.basename(path)} is not a regular file (a FIFO, socket or device)")
    if st.st_size > limit:
        raise Refused(f"{os.path.basename(path)} is larger than {limit} bytes")
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise Refused(f"{os.path.basename(path)} cannot be opened ({exc.strerror})") from None
    try:
        st = os.fstat(fd)  # the file opened is the one checked (no swap between lstat and open)
        if not stat.S_ISREG(st.st_mode) or st.st_size > limit:
            raise Refused(f"{os.path.basename(path)} changed while it was read")
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise Refused(f"{os.path.basename(path)} is larger than {limit} bytes")
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_text(path: Path | str, limit: int) -> str:
    return read_bytes(path, limit).decode("utf-8", errors="replace")


def copy_tree(src: Path, dest: Path, limit: int = MAX_NOTEBOOK_BYTES) -> None:
    """Copy the regular files (and folders) of a tree a run wrote; links, FIFOs and devices are
    left out, and so is any file over `limit`."""
    dest.mkdir(parents=True, exist_ok=True)
    for entry in os.scandir(src):
        if entry.is_symlink():
            continue
        if entry.is_dir(follow_symlinks=False):
            copy_tree(Path(entry.path), dest / entry.name, limit)
        elif entry.is_file(follow_symlinks=False):
            try:
                (dest / entry.name).write_bytes(read_bytes(entry.path, limit))
            except OSError:
                continue


# --- text ----------------------------------------------------------------------------------------

# ANSI escape sequences (CSI, OSC, and two-character ones), then any other C0/C1 control character
_ANSI = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-_]|\x9b[0-?]*[ -/]*[@-~]"
)
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def plain(text: object, limit: int | None = None, newlines: bool = False) -> str:
    """`text` with terminal escapes removed and every other control character (a bare CR, a
    backspace, bidirectional overrides) shown as `?`; newlines and tabs become spaces unless
    `newlines`. Cut to `limit` characters when given."""
    s = _ANSI.sub("", str(text))
    if not newlines:
        s = s.replace("\r\n", " ").replace("\n", " ").replace("\t", " ")
    else:
        s = s.replace("\r\n", "\n").replace("\t", " ")
    s = _CONTROL.sub("?", s)
    if limit is not None and len(s) > limit:
        s = s[: max(0, limit - 3)] + "..."
    return s


_LINK_SCHEME = re.compile(r"(?i)\b(javascript|vbscript|data|file)\s*:")


def markdown_text(text: object, limit: int | None = None) -> str:
    """A learner's string inside a Markdown feedback file: plain (one line), with HTML escaped
    (`<script>` shows as text), no link syntax or table breaks, and no script link scheme."""
    s = plain(text, limit)
    s = s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    s = _LINK_SCHEME.sub(lambda m: f"{m.group(1)}&#58;", s)
    for ch in "\\[]|":
        s = s.replace(ch, "\\" + ch)
    return s


_FORMULA_START = ("=", "+", "-", "@", "\t", "\r", "\n")


def csv_cell(text: object) -> str:
    """A text cell of the gradebook: plain, HTML escaped (a gradebook may be shown in a web page),
    no script link, and never read as a formula by a spreadsheet."""
    s = plain(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    s = _LINK_SCHEME.sub(lambda m: f"{m.group(1)}&#58;", s)
    if s.startswith(_FORMULA_START) or str(text).startswith(_FORMULA_START):
        s = "'" + s
    return s
