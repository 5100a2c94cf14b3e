"""Run one instrumented notebook with papermill (the grader starts this in its own process).

    python -m lab_utils.grading.execute IN.ipynb OUT --cwd DIR [--copy-from DIR] --cell-timeout S
                                        (--status F | --report-fd N)

The grader runs this inside the sandbox (grader/sandbox.py).

Every cell runs even after one raised (errors are recorded, not fatal), so each question gets its
chance. The outcome is JSON: {"outcome": "ok" | "cell errors" | "kernel died" | "cell timeout" |
"failed", "detail": ...}.

With `--report-fd N` (how the grader runs it) nothing the grader trusts is a file: the outcome and
every save of the executed notebook go to the grader as frames on descriptor N (a pipe), and OUT
is ignored. This process then makes itself non-dumpable, so the notebook's kernel, which runs as
the same user, can neither open that descriptor through /proc nor trace this process; the kernel
does not inherit it. A notebook can still kill this process: the grader then has no report and
says so.
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback


def _seed_vllm_model_info(home: str | None, source: str | None) -> int:
    """Copy the grader's vLLM model-class cache (its JSON files) into this run's new home, where
    vLLM looks (~/.cache/vllm/modelinfos): without it each engine the notebook starts inspects the
    model's class again in a subprocess (about 8 s of CPU). Returns the files copied; a missing or
    unreadable source copies nothing (vLLM then inspects, as on a first start)."""
    import os
    import shutil

    if not home or not source or os.environ.get("VLLM_CACHE_ROOT") or not os.path.isdir(source):
        return 0
    dest = os.path.join(home, ".cache", "vllm", "modelinfos")
    copied = 0
    try:
        names = sorted(os.listdir(source))
    except OSError:
        return 0
    for name in names:
        path = os.path.join(source, name)
        if not name.endswith(".json") or os.path.islink(path) or not os.path.isfile(path):
            continue
        if os.path.getsize(path) > 1 << 20:  # a model-info file is a few hundred bytes
            continue
        try:
            os.makedirs(dest, exist_ok=True)
            shutil.copyfile(path, os.path.join(dest, name))
            copied += 1
        except OSError:
            pass
    return copied


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("input")
    parser.add_argument("output")
    parser.add_argument("--cwd", required=True)
    parser.add_argument("--copy-from", default=None, help="copy this folder's files into --cwd first")
    parser.add_argument("--cell-timeout", type=float, default=600)
    parser.add_argument("--status", default=None, help="write the outcome to this file (a plain run)")
    parser.add_argument("--report-fd", type=int, default=None, help="send outcome and notebook on this pipe")
    parser.add_argument("--kernel", default="python3")
    args = parser.parse_args(argv)
    if (args.status is None) == (args.report_fd is None):
        parser.error("give one of --status FILE or --report-fd N")
    channel = _Channel(args.report_fd) if args.report_fd is not None else None

    import os
    import shutil

    if args.copy_from:  # the student's other files, from the read-only input into the private work folder
        shutil.copytree(args.copy_from, args.cwd, symlinks=True, dirs_exist_ok=True)
    os.makedirs(args.cwd, exist_ok=True)
    os.makedirs(os.environ.get("HOME", args.cwd), exist_ok=True)
    _seed_vllm_model_info(os.environ.get("HOME"), os.environ.get("LAB_VLLM_MODEL_INFO"))

    import papermill as pm
    from papermill.exceptions import PapermillExecutionError

    def report(outcome: str, detail: str = "") -> None:
        data = json.dumps({"outcome": outcome, "detail": detail[-2000:]})
        if channel is not None:
            channel.send(b"S", data.encode())
            return
        with open(args.status, "w") as f:
            f.write(data)

    output = args.output
    if channel is not None:  # papermill saves the notebook through this handler, never to a file
        from papermill.iorw import papermill_io

        papermill_io.register(REPORT_SCHEME, _NotebookToChannel(channel))
        output = REPORT_SCHEME + "executed.ipynb"

    report("started")
    try:
        pm.execute_notebook(
            args.input,
            output,
            kernel_name=args.kernel,
            cwd=args.cwd,
            execution_timeout=args.cell_timeout,
            progress_bar=False,
            log_output=False,
            request_save_on_cell_execute=True,
            allow_errors=True,
        )
        report("ok")
    except PapermillExecutionError as exc:
        report("cell errors", f"{exc.ename}: {exc.evalue}")
    except MemoryError:
        report("memory limit", "the grader process ran out of memory (huge outputs?)")
    except Exception as exc:
        name = type(exc).__name__
        text = "".join(traceback.format_exception_only(type(exc), exc))
        if name == "DeadKernelError" or "dead" in text.lower() and "kernel" in text.lower():
            report("kernel died", text)
        elif name in ("CellTimeoutError", "TimeoutError") or "timed out" in text.lower():
            report("cell timeout", text)
        else:
            report("failed", text)
    return 0


REPORT_SCHEME = "lab-report://"
FRAME_HEADER = 9  # one byte of kind (b"S": status, b"N": notebook), eight of length, big-endian


class _Channel:
    """The write end of the grader's report pipe, held by this process alone."""

    def __init__(self, fd: int):
        import ctypes
        import os

        os.set_inheritable(fd, False)  # the kernel and servers this run starts never get it
        try:  # PR_SET_DUMPABLE = 4: /proc/<pid>/fd and ptrace closed to processes of our own uid
            ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)
        except (OSError, AttributeError):
            pass
        self.fd = fd

    def send(self, kind: bytes, payload: bytes) -> None:
        import os

        data = kind + len(payload).to_bytes(8, "big") + payload
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(self.fd, view) :]
            except BrokenPipeError:
                return  # the grader stopped reading: it has what it needs


class _NotebookToChannel:
    """A papermill I/O handler: every save of the executed notebook becomes one frame."""

    def __init__(self, channel: _Channel):
        self.channel = channel

    def read(self, path):
        raise OSError(f"{path} is write-only")

    def listdir(self, path):
        raise OSError(f"{path} is write-only")

    def write(self, buf, path):
        self.channel.send(b"N", buf.encode("utf-8") if isinstance(buf, str) else bytes(buf))

    def pretty_path(self, path):
        return path


if __name__ == "__main__":
    sys.exit(main())
