"""Limited, sandboxed child processes for the grader: every run of learner code goes through here.

Two layers:

1. **The sandbox** (bubblewrap, `bwrap`): a learner's notebook kernel, the servers it starts, and
   every later call of the learner's functions run as `nobody` in their own PID, network, IPC and
   user namespaces (loopback only; every descendant dies with the run), with a read-only view of
   the system and the course library, a private size-capped `/tmp` (the working folder), a private
   `/dev/shm`, a minimal environment (no instructor variables, no keys, no grader arguments), and
   none of: the instructor folder, the output folder, the submissions, the instructor side of the
   grader (`grader/`), the grader's scratch folders or processes. Only the folders a run is given
   are visible inside (`/tmp/in` read-only, `/tmp/out` writable, its size watched). On a GPU
   machine the NVIDIA device nodes are bound in.
2. **The limits** (`run_limited`, from outside): a wall-time limit, a memory limit on the whole
   tree measured as proportional set size (shared pages counted once, not once per process: vLLM's
   workers share most of their pages), a cap on the bytes written to the output folder, no core
   files, and a small guard (this file run as a script) that kills the whole tree if the grader
   that started it dies.

Where bubblewrap cannot run, `Sandbox.check()` says why and what to install; the grader then
refuses to grade unless told `--no-sandbox`, and marks every row graded that way `unsandboxed`.

This module imports only the standard library at the top, so the guard starts fast.
"""

from __future__ import annotations

import enum
import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

NOBODY = 65534
STOP = threading.Event()  # set when the grader is interrupted: every run in flight is killed


class Stopped(BaseException):
    """The grader was interrupted (Ctrl-C) while this run was in flight; its grade is not kept."""


INSIDE_IN, INSIDE_OUT, INSIDE_WORK = "/tmp/in", "/tmp/out", "/tmp/work"


class Status(str, enum.Enum):
    """How one submission's grading ended; the gradebook's status column starts with the value."""

    OK = "ok"
    CELL_ERRORS = "cell errors"  # some cells raised; every question was still scored
    TIMEOUT = "timeout"
    MEMORY_LIMIT = "memory limit"
    DISK_LIMIT = "disk limit"
    KERNEL_DIED = "kernel died"
    KILLED = "killed"  # by a signal, from inside the notebook
    FAILED = "failed"  # the run stopped without a report
    NOT_A_NOTEBOOK = "not a notebook"
    EMPTY = "empty notebook"
    WRONG_LAB = "wrong lab"
    DUPLICATE = "duplicate"
    UNREADABLE = "unreadable"
    REFUSED = "refused"  # a symlink, a special file, a folder too large or too deep
    NO_QUESTIONS = "no graded questions"
    COPY = "copy of the published solution"
    GRADER_ERROR = "grader error"

    def text(self, detail: str = "") -> str:
        """The status column: `value` or `value: detail` (no timings, so reruns compare equal)."""
        return f"{self.value}: {detail}" if detail else self.value

    @property
    def failed(self) -> bool:
        """Counted as a failure in the progress line (cell errors are the learner's, not a failure)."""
        return self not in (Status.OK, Status.CELL_ERRORS)

    @classmethod
    def of(cls, text: str) -> Status:
        """The status a status-column text starts with (GRADER_ERROR for an unknown one)."""
        for s in sorted(cls, key=lambda s: -len(s.value)):
            if text == s.value or text.startswith(s.value + ":") or text.startswith(s.value + " "):
                return s
        return cls.GRADER_ERROR


# --- the sandbox -------------------------------------------------------------------------------


def _bwrap() -> str | None:
    return shutil.which("bwrap")


_PROBED: dict[str, str] = {}


def sandbox_problem() -> str:
    """ "" when bubblewrap runs here, else why not and what to install (probed once per process)."""
    if "problem" in _PROBED:
        return _PROBED["problem"]
    exe = _bwrap()
    if sys.platform != "linux":
        why = f"the sandbox needs Linux namespaces (this is {sys.platform})"
    elif exe is None:
        why = "bubblewrap (`bwrap`) is not installed: `apt-get install bubblewrap` (Debian/Ubuntu), `make setup` does it as root"
    else:
        probe = subprocess.run(
            guarded(Sandbox(uid=SANDBOX_UID_BASE - 1).wrap(["/bin/true"])),
            capture_output=True,
            text=True,
            timeout=30,
        )
        why = (
            ""
            if probe.returncode == 0
            else (
                f"bubblewrap cannot create its namespaces here ({probe.stderr.strip()[:200]}); "
                "enable unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1) or run as root"
            )
        )
    _PROBED["problem"] = why
    return why


def _within(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


# --- what a run sees: an allow list --------------------------------------------------------------
# The sandbox's root is an empty tmpfs (bubblewrap's own); only what is listed here is bound into
# it, read-only, each at its own host path (so /proc/self/mountinfo names no host path but the bind
# points themselves). Nothing else of the host exists inside: no repository, no homes, no other
# projects, no instructor folder.

SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# kernel views a run needs to size itself (torch and vLLM read CPU and NUMA topology from /sys)
KERNEL_VIEWS = ("/sys",)
# the few files of /etc that Python, its libraries and the course's servers read
ETC_FILES = (
    "passwd",
    "group",
    "hosts",
    "host.conf",
    "nsswitch.conf",
    "resolv.conf",
    "gai.conf",
    "protocols",
    "services",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "timezone",
    "os-release",
    "mime.types",
    "ssl",
    "ca-certificates",
    "ca-certificates.conf",
    "alternatives",
    "fonts",
    "prometheus",
)


def course_roots() -> dict[str, str]:
    """The host folders of the course a run needs, by what they are: the Python environment, the
    interpreter it was made from, the Triton server's environment and the course cache (the
    prepared models and the learner's copy). The repository itself is not one of them."""
    roots = {"environment": sys.prefix, "interpreter": sys.base_prefix}
    triton = os.environ.get("TRITON_VENV") or str(Path(__file__).resolve().parent.parent / ".venv-triton")
    if os.path.isdir(triton):
        roots["triton environment"] = triton
    cache = os.environ.get("COURSE_CACHE")
    roots["course cache"] = cache if cache else str(Path.home() / ".cache" / "llm-serving-lab")
    info = vllm_model_info_dir()
    if info:
        roots["vllm model info"] = info
    return roots


def vllm_model_info_dir() -> str | None:
    """The instructor's vLLM model-class cache (VLLM_CACHE_ROOT/modelinfos, small JSON files), or
    None when vLLM has not written one yet. vLLM inspects a model's class in a subprocess of its own
    (about 8 s of CPU on 2 cores) unless this folder holds the result; a run's home is new each time,
    so the sandbox shows it read-only and lab_utils.grading.execute copies it into the run's home."""
    root = os.environ.get("VLLM_CACHE_ROOT") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache"), "vllm"
    )
    info = os.path.join(os.path.expanduser(root), "modelinfos")
    return info if os.path.isdir(info) else None


def _needed() -> list[str]:
    return list(course_roots().values())


def _outermost(paths) -> list[str]:
    """Existing folders among `paths` (resolved), none inside another or inside a system folder."""
    found = sorted({os.path.realpath(p) for p in paths if p and os.path.isdir(p)})
    system = [d for d in SYSTEM_DIRS if os.path.isdir(d) and not os.path.islink(d)]
    return [
        p
        for p in found
        if p != "/"
        and not any(_within(p, d) for d in system)
        and not any(q != p and _within(p, q) for q in found)
    ]


def allow_list(course: str = "") -> list[str]:
    """Every host path a sandboxed run may read (its own job folders aside)."""
    paths = [d for d in SYSTEM_DIRS if os.path.isdir(d) and not os.path.islink(d)]
    paths += [d for d in KERNEL_VIEWS if os.path.isdir(d)]
    paths += [f"/etc/{n}" for n in ETC_FILES if os.path.exists(f"/etc/{n}")]
    paths += _outermost([*_needed(), course] if course else _needed())
    return paths


SANDBOX_UID_BASE = 640_000  # the host uids sandboxed code runs as when the grader is root
NPROC_LIMIT = (
    1024  # processes and threads one run may hold (RLIMIT_NPROC of its own uid; vLLM runs many threads)
)
_UIDS_LOCK = threading.Lock()
_UIDS_USED: set[int] = set()


def lease_uid() -> int:
    """A host uid no other run of this grader holds: each run counts its own processes."""
    with _UIDS_LOCK:
        # pid x 64: two live graders (make test runs two pytest processes) never share a uid range;
        # pids stay under 2**22 (Linux's pid_max), so the uids stay under 2**28
        uid = SANDBOX_UID_BASE + os.getpid() * 64
        while uid in _UIDS_USED:
            uid += 1
        _UIDS_USED.add(uid)
        return uid


def release_uid(uid: int) -> None:
    with _UIDS_LOCK:
        _UIDS_USED.discard(uid)


def privileged() -> bool:
    """The grader runs as root: bubblewrap then sets the sandbox up as root and drops, inside, to
    an unprivileged host uid (no user namespace, so nothing inside is root in disguise)."""
    return hasattr(os, "geteuid") and os.geteuid() == 0


def share_course_files(paths: list[str]) -> None:
    """Make the course's own files (model, adapters, environment) readable by the sandbox's uid:
    public course data that a prepared cache may have written 0600. Private files stay as they
    are (only folders named models/merged/adapters of the course cache and environments)."""
    for top in paths:
        base = Path(top)
        for sub in ("models", "merged", "adapters"):
            folder = base / sub
            if not folder.is_dir() or folder.is_symlink():
                continue
            for dirpath, dirnames, filenames in os.walk(folder):
                for name in dirnames + filenames:
                    p = os.path.join(dirpath, name)
                    try:
                        st = os.lstat(p)
                        want = 0o005 if os.path.isdir(p) else 0o004
                        if not os.path.islink(p) and st.st_mode & want != want:
                            os.chmod(p, st.st_mode | want)
                    except OSError:
                        continue


def _open_to_others(top: str, limit: int = 20_000) -> None:
    """Let any user read a folder handed to a run read-only (o+r on files, o+rx on folders); its
    place on the host stays closed (the run sees it only where it is bound)."""
    stack, seen = [top], 0
    while stack and seen < limit:
        path = stack.pop()
        seen += 1
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISLNK(st.st_mode):
            continue
        want = 0o005 if stat.S_ISDIR(st.st_mode) else 0o004
        if st.st_mode & want != want:
            try:
                os.chmod(path, st.st_mode & 0o7777 | want)
            except OSError:
                pass
        if stat.S_ISDIR(st.st_mode):
            try:
                stack += [e.path for e in os.scandir(path)]
            except OSError:
                continue


@dataclass
class Sandbox:
    """What one sandboxed run sees. Paths are on the host; `read_only` maps host -> inside."""

    read_only: dict[str, str] = field(default_factory=dict)  # extra host folders, read-only inside
    writable: dict[str, str] = field(default_factory=dict)  # host folders written inside (/tmp/out)
    hide: list[str] = field(default_factory=list)  # folders inside a bound one, emptied inside
    course: str = ""  # the course copy the run imports (PYTHONPATH, LAB_REPO_ROOT); "": the learner's copy
    tmp_mb: int = 2048  # the private /tmp (the working folder lives there), in memory
    shm_mb: int = 512  # vLLM's CPU workers pass tensors through shared memory
    env: dict[str, str] = field(default_factory=dict)
    cwd: str = INSIDE_WORK
    gpu: bool = False
    uid: int = NOBODY  # the host uid learner code runs as when the grader is root
    nproc: int = NPROC_LIMIT
    cpus: float = 0.0  # the run's CPU share in cores while the machine is busy (0: no share; see _throttle)

    def course_folder(self) -> str:
        """The course a run imports: the learner's copy (built on first use) unless given."""
        if not self.course:
            from .course_copy import learner_copy

            self.course = str(learner_copy())
        return self.course

    def options(self) -> list[str]:
        root = privileged()
        opts: list[str] = []
        made: set[str] = {"/"}

        def parents(dest: str) -> None:
            # the folders that hold a bind point: made on the sandbox's own root, enterable by all
            for parent in reversed(Path(dest).parents):
                p = str(parent)
                if p not in made:
                    made.add(p)
                    opts.extend(["--perms", "0755", "--dir", p])

        for d in SYSTEM_DIRS:  # merged-/usr systems keep /bin, /lib ... as links into /usr
            if os.path.islink(d):
                opts += ["--symlink", os.readlink(d), d]
            elif os.path.isdir(d):
                opts += ["--ro-bind", d, d]
        for d in KERNEL_VIEWS:
            if os.path.isdir(d):
                opts += ["--ro-bind", d, d]
        parents("/etc/x")
        for name in ETC_FILES:
            if os.path.exists(f"/etc/{name}"):
                opts += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]
        opts += ["--dev", "/dev", "--proc", "/proc"]
        opts += [
            "--size",
            str(self.tmp_mb * 2**20),
            "--perms",
            "1777",
            "--tmpfs",
            "/tmp",
            "--size",
            str(self.shm_mb * 2**20),
            "--perms",
            "1777",
            "--tmpfs",
            "/dev/shm",
            "--perms",
            "0777",
            "--dir",
            INSIDE_WORK,
        ]
        made |= {"/tmp", "/dev", "/dev/shm", INSIDE_WORK}
        info = course_roots().get("vllm model info")
        if root and info:  # vLLM writes each file 0600 (a temporary file, renamed): let the run's uid read it
            _open_to_others(info)
        needed = _outermost([*_needed(), self.course_folder()])
        for path in needed:
            parents(path)
            opts += ["--ro-bind", path, path]
        for link in _needed():  # an environment reached through a link (a .venv that is a symlink):
            real = os.path.realpath(link)  # the run calls the interpreter by the link's path
            link = os.path.abspath(link)
            if link != real and os.path.isdir(real) and not any(_within(link, n) for n in needed):
                if link not in made:
                    parents(link)
                    made.add(link)
                    opts += ["--symlink", real, link]
        for path in self.hide:  # within a bound folder: replaced by an empty one
            real = os.path.realpath(path)
            if not any(_within(real, n) for n in needed):
                continue  # not visible anyway
            if os.path.isdir(real):
                opts += ["--tmpfs", real]
            elif os.path.exists(real):
                opts += ["--ro-bind", "/dev/null", real]
        for inside in [*self.read_only.values(), *self.writable.values()]:
            parents(inside)
        for host, inside in self.read_only.items():
            if root:  # handed to the run on purpose: its own uid must be able to read it
                _open_to_others(host)
            opts += ["--ro-bind", host, inside]
        for host, inside in self.writable.items():
            opts += ["--bind", host, inside]
        if self.gpu:
            for dev in sorted(Path("/dev").glob("nvidia*")):
                opts += ["--dev-bind", str(dev), str(dev)]
        opts += ["--remount-ro", "/"]
        if root:  # no user namespace: the uid drop happens inside (setpriv, see wrap)
            opts += [
                "--unshare-pid",
                "--unshare-net",
                "--unshare-ipc",
                "--unshare-uts",
                "--unshare-cgroup-try",
            ]
        else:
            opts += [
                "--unshare-all",
                "--uid",
                str(NOBODY),
                "--gid",
                str(NOBODY),
            ]  # user, pid, net, ipc, uts, cgroup
        opts += [
            "--die-with-parent",
            "--new-session",
            "--hostname",
            "sandbox",
            "--clearenv",
            "--chdir",
            self.cwd,
        ]
        if not root:
            opts += ["--cap-drop", "ALL"]
        for key, value in sorted(self.course_env().items()):
            opts += ["--setenv", key, value]
        return opts

    def course_env(self) -> dict[str, str]:
        """`self.env`, with the course variables pointing into the sandbox's own view."""
        env = dict(self.env)
        course = self.course_folder()
        env["PYTHONPATH"] = course  # the learner's copy, before the environment's own entries
        env["LAB_REPO_ROOT"] = course
        triton = course_roots().get("triton environment")
        if triton:
            env["TRITON_VENV"] = triton
        return env

    def inner(self, cmd: list[str]) -> list[str]:
        """`cmd` as started inside: as root, dropped to the run's own uid, no capabilities, and a
        limit on the processes that uid may hold (a fork bomb stops there)."""
        limit = ["prlimit", f"--nproc={self.nproc}:{self.nproc}", "--core=0:0", "--"]
        if not privileged():
            return [*limit, *cmd]
        drop = [
            "setpriv",
            f"--reuid={self.uid}",
            f"--regid={self.uid}",
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
            "--no-new-privs",
            "--",
        ]
        return [*drop, *limit, *cmd]

    def wrap(self, cmd: list[str], env: dict | None = None) -> list[str]:
        """`cmd` run inside this sandbox with exactly `env` (plus `self.env`) as its environment.

        The result is started through `guarded` (the guard passes the options to bubblewrap on a
        pipe, so the sandbox's own /proc/1/cmdline shows no host path, and keeps the run to its CPU share)."""
        exe = _bwrap()
        if exe is None:
            raise RuntimeError(sandbox_problem())
        if env:
            self.env = {**env, **self.env}
        opts = self.options()
        return [exe, _OPTS_MARK, str(len(opts)), f"{max(0.0, self.cpus):g}", *opts, "--", *self.inner(cmd)]


_OPTS_MARK = "--lab-sandbox-options"


# --- the parent side ---------------------------------------------------------------------------


def _pss_kb(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def tree_memory_mb(pid: int) -> float:
    """Memory of a process and all its descendants in MB, as proportional set size: a page shared by
    k processes counts 1/k in each, so the sum is what the tree really holds (resident size when
    the kernel gives no PSS)."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root] + root.children(recursive=True)
    except psutil.Error:
        return 0.0
    total_kb = 0
    for p in procs:
        kb = _pss_kb(p.pid)
        if kb is None:
            try:
                kb = p.memory_info().rss // 1024
            except psutil.Error:  # it exited between listing and reading: it uses nothing now
                continue
        total_kb += kb
    return total_kb / 1024


tree_rss_mb = tree_memory_mb  # the old name


def folder_bytes(path: Path, limit: int) -> int:
    """Bytes under `path` (files only, links not followed), stopping early once past `limit`."""
    total = 0
    stack = [str(path)]
    while stack:
        try:
            entries = os.scandir(stack.pop())
        except OSError:
            continue
        with entries:
            for e in entries:
                try:
                    if e.is_dir(follow_symlinks=False):
                        stack.append(e.path)
                    elif e.is_file(follow_symlinks=False):
                        total += e.stat(follow_symlinks=False).st_blocks * 512
                except OSError:
                    continue
                if total > limit:
                    return total
    return total


def kill_tree(pid: int) -> None:
    """Kill a process's descendants, then its process group (a Jupyter kernel may start its own
    session, so the group alone is not enough; the group goes last because it may hold the caller)."""
    import psutil

    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        children = []
    for child in children:
        try:
            child.kill()
        except psutil.Error:
            continue  # already exited
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # the group is already gone


def guarded(cmd: list[str], pass_fds: tuple[int, ...] = ()) -> list[str]:
    """`cmd` under the guard that stops it when this process dies; `pass_fds` reach `cmd`."""
    keep = [a for fd in pass_fds for a in ("--pass-fd", str(fd))]
    return [sys.executable, str(Path(__file__).resolve()), "--guard", str(os.getpid()), *keep, "--", *cmd]


LOG_CAP_BYTES = 4 * 2**20  # of a run's output kept in its log; the rest is read and dropped
REPORT_CAP_BYTES = 64 * 2**20  # one report frame (an executed notebook) larger than this is dropped
REPORT_FD = "@REPORT_FD@"  # in a command: replaced by the number of the report pipe's write end


def _drain(src, dest: Path, cap: int) -> None:
    """Copy a run's output pipe into `dest` up to `cap` bytes, then read and drop the rest, so a run
    that floods its output neither blocks nor grows a host file."""
    kept = 0
    with open(dest, "wb") as out:
        while chunk := src.read(65536):
            if kept < cap:
                out.write(chunk[: cap - kept])
                kept += len(chunk[: cap - kept])
                if kept >= cap:
                    out.write(b"\n[... output past the log cap dropped by the grader ...]\n")
                    out.flush()
    src.close()


def _read_frames(fd: int, reports: dict, cap: int) -> None:
    """Keep the last frame of each kind the run's driver sent on its report pipe (see
    lab_utils.grading.execute): b"S" its status, b"N" the executed notebook."""
    with os.fdopen(fd, "rb", buffering=0) as pipe:

        def exactly(n: int, keep: bool) -> bytes | None:
            parts, got = [], 0
            while got < n:
                chunk = pipe.read(min(65536, n - got))
                if not chunk:
                    return None
                got += len(chunk)
                if keep:
                    parts.append(chunk)
            return b"".join(parts)

        while (head := exactly(9, True)) is not None:
            kind, size = head[:1], int.from_bytes(head[1:], "big")
            body = exactly(size, size <= cap)
            if body is None and size <= cap:
                break  # cut short: the run ended mid-frame; the last whole frame stands
            name = {b"S": "status", b"N": "notebook"}.get(kind)
            if name and size <= cap:
                reports[name] = body
            elif name:
                reports[f"{name}_dropped"] = size


def run_limited(
    cmd: list[str],
    *,
    timeout: float,
    memory_mb: int,
    env: dict,
    cwd: Path,
    log: Path,
    sandbox: Sandbox | None = None,
    watch_dir: Path | None = None,
    disk_mb: int = 0,
    reports: dict | None = None,
) -> tuple[int | None, Status | None]:
    """Run cmd (inside `sandbox` when given) in its own session under a wall-time, a memory and a
    disk limit (bytes written under `watch_dir`).

    No host file descriptor reaches the run: its output goes through a pipe that this process
    copies into `log` up to LOG_CAP_BYTES. With `reports` (a dict), the run also gets the write end
    of a report pipe, named in `cmd` by REPORT_FD; what its driver sends there fills `reports`
    (`status`, `notebook`: bytes, the last of each).

    Returns (exit code, None) when it finished, or (None, Status.TIMEOUT | MEMORY_LIMIT | DISK_LIMIT)
    when it was stopped. A negative exit code is the signal that ended it.
    """
    report_r = report_w = None
    if reports is not None:
        report_r, report_w = os.pipe()
        cmd = [str(report_w) if a == REPORT_FD else a for a in cmd]
    inner = sandbox.wrap(cmd, env) if sandbox is not None else cmd
    readers = []
    try:
        proc = subprocess.Popen(
            guarded(inner, (report_w,) if report_w is not None else ()),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=str(cwd),
            start_new_session=True,
            pass_fds=(report_w,) if report_w is not None else (),
        )
    finally:
        if report_w is not None:
            os.close(report_w)  # only the run holds it now: its end is the reader's end of file
    readers.append(threading.Thread(target=_drain, args=(proc.stdout, log, LOG_CAP_BYTES), daemon=True))
    if report_r is not None:
        readers.append(
            threading.Thread(target=_read_frames, args=(report_r, reports, REPORT_CAP_BYTES), daemon=True)
        )
    for t in readers:
        t.start()
    deadline = time.monotonic() + timeout
    stopped: Status | None = None
    code: int | None = None
    next_disk = 0.0
    try:
        while True:
            try:
                code = proc.wait(timeout=0.25)
                if STOP.is_set():
                    raise Stopped("the grader was interrupted")
                break
            except subprocess.TimeoutExpired:
                pass
            now = time.monotonic()
            if STOP.is_set():
                raise Stopped("the grader was interrupted")
            if now > deadline:
                stopped = Status.TIMEOUT
            elif memory_mb and tree_memory_mb(proc.pid) > memory_mb:
                stopped = Status.MEMORY_LIMIT
            elif disk_mb and watch_dir is not None and now >= next_disk:
                next_disk = now + 1.0
                if folder_bytes(watch_dir, disk_mb * 2**20) > disk_mb * 2**20:
                    stopped = Status.DISK_LIMIT
            if stopped:
                break
    finally:
        # a kernel or server left running by a crashed papermill is still ours to stop
        kill_tree(proc.pid)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass  # unkillable (D state); the guard's own watch stops it when it wakes
        for t in readers:  # the run's tree is gone: its pipes are at their end
            t.join(timeout=10)
    return (None, stopped) if stopped else (code, None)


# --- the guard (this file run as a script) -----------------------------------------------------


def _pipe_with(data: bytes) -> int:
    """The read end of a pipe that holds `data` (small: it fits the pipe's buffer)."""
    r, w = os.pipe()
    try:
        os.write(w, data)
    finally:
        os.close(w)
    return r


def _bwrap_by_pipe(cmd: list[str]) -> tuple[list[str], list[int], float]:
    """A `Sandbox.wrap` command with its options moved to a pipe (`bwrap --args FD`), and the run's
    CPU share: the sandbox's pid 1 is bubblewrap, and its command line is all that a learner's code
    can read of the host side."""
    if len(cmd) < 4 or cmd[1] != _OPTS_MARK:
        return cmd, [], 0.0
    n, cpus = int(cmd[2]), float(cmd[3])
    opts, rest = cmd[4 : 4 + n], cmd[4 + n :]
    args = _pipe_with(b"".join(o.encode() + b"\0" for o in opts))
    return [cmd[0], "--args", str(args), *rest], [args], cpus


# --- the CPU share -------------------------------------------------------------------------------
# There are no writable cgroups on the machines this runs on, and the kernel's per-session share
# (autogroup) counts a run once per session it starts: a run that forks 40 busy processes, each
# calling setsid, got 40/41 of the machine. A filter that made setsid a no-op fixed that but broke
# the course's servers, which start in a session of their own and are stopped by killpg on their
# pid. So the guard measures the CPU time of everything the run started and, while the machine has
# no idle core, stops the whole run (SIGSTOP, then SIGCONT) long enough to bring it back to its
# share. A machine with idle time charges nothing: a run alone uses every core.

TICK_S = 0.2  # how often the guard measures
BURST_S = 0.5  # CPU seconds a run may run ahead of its share before it is paused
BUSY_IDLE_CORES = 0.25  # less idle than this (in cores) over a tick: the machine is busy


def _tree(pid: int):
    import psutil

    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def tree_cpu_seconds(procs) -> float:
    """CPU seconds used by `procs` and the children they have waited for."""
    import psutil

    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
        except psutil.Error:
            continue  # exited: its parent's children times hold it once waited for
        total += t.user + t.system + t.children_user + t.children_system
    return total


def _signal_all(procs, sig: int) -> None:
    for p in procs:
        try:
            p.send_signal(sig)
        except Exception:  # psutil.Error: it exited
            continue


def _throttle(root: int, cpus: float, running) -> None:
    """Keep the processes under `root` (not `root` itself) within `cpus` cores while the machine
    is busy, until running() is False."""
    import psutil

    idle_before = psutil.cpu_times().idle
    used_before = tree_cpu_seconds(_tree(root))
    debt = 0.0  # CPU seconds used beyond the share while the machine was busy
    while running():
        time.sleep(TICK_S)
        procs = _tree(root)
        used, idle = tree_cpu_seconds(procs), psutil.cpu_times().idle
        spent, spare = max(0.0, used - used_before), max(0.0, idle - idle_before)
        used_before, idle_before = used, idle
        if spare > BUSY_IDLE_CORES * TICK_S:
            debt = 0.0  # a core was idle: nobody waited for this run's time
            continue
        debt = max(0.0, debt + spent - cpus * TICK_S)
        if debt <= BURST_S:
            continue
        pause = min(1.0, (debt - BURST_S / 2) / cpus)
        _signal_all(procs, signal.SIGSTOP)
        try:
            time.sleep(pause)
        finally:
            _signal_all(_tree(root), signal.SIGCONT)  # whatever is there now, stopped or not
        debt = max(0.0, debt - cpus * pause)
        used_before, idle_before = tree_cpu_seconds(_tree(root)), psutil.cpu_times().idle


def _guard(parent: int, cmd: list[str], keep: tuple[int, ...] = ()) -> int:
    import resource
    import threading

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a crashing kernel writes no core file
    cmd, fds, cpus = _bwrap_by_pipe(cmd)
    # same session and group as the guard, limits inherited; `keep` (the report pipe) passes through
    child = subprocess.Popen(cmd, pass_fds=(*fds, *keep))
    for fd in (*fds, *keep):
        os.close(fd)
    if cpus > 0:
        args = (os.getpid(), cpus, lambda: child.poll() is None)
        threading.Thread(target=_throttle, args=args, daemon=True).start()

    def watch() -> None:
        while child.poll() is None:
            if os.getppid() != parent:  # the grader died: stop everything this run started
                try:
                    kill_tree(os.getpid())
                finally:
                    os._exit(137)
            time.sleep(0.5)

    threading.Thread(target=watch, daemon=True).start()
    code = child.wait()
    if code < 0:  # die of the same signal, so the grader sees what killed the run
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        time.sleep(1)
    return code


def _guard_args(argv: list[str]) -> tuple[int, tuple[int, ...], list[str]]:
    """`--guard PARENT_PID [--pass-fd N]... -- COMMAND ...` -> (parent, fds, command)."""
    if len(argv) < 4 or argv[0] != "--guard" or "--" not in argv:
        raise SystemExit("usage: sandbox.py --guard PARENT_PID [--pass-fd N]... -- COMMAND ...")
    split = argv.index("--")
    opts, cmd = argv[2:split], argv[split + 1 :]
    if len(opts) % 2 or any(o != "--pass-fd" for o in opts[::2]) or not cmd:
        raise SystemExit("usage: sandbox.py --guard PARENT_PID [--pass-fd N]... -- COMMAND ...")
    return int(argv[1]), tuple(int(fd) for fd in opts[1::2]), cmd


if __name__ == "__main__":
    _parent, _keep, _cmd = _guard_args(sys.argv[1:])
    sys.exit(_guard(_parent, _cmd, _keep))
