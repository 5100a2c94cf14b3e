"""The judge's side of a sandboxed runner: learner answers as proxies that only exchange plain data.

`Runner` starts `python -m lab_utils.grading.sandboxed` inside the sandbox, with one question's
forbidden references replaced there. `runner.answer(name)` gives the answer: plain data as itself
(numbers, strings, lists, dicts, course dataclasses rebuilt field by field), anything else as a
`Remote` proxy. Calling a proxy, reading its attributes or items, iterating it or converting it
with int()/float()/str() sends one request and waits for the reply, with a deadline and a memory
limit on the runner. Nothing that comes back is unpickled or imported: see lab_utils.grading.wire.

A runner that dies, hangs, floods its output or answers with malformed data raises `RunnerFailed`,
and the question it was serving scores zero; the others are unaffected (each has its own runner).
"""

from __future__ import annotations

import base64
import builtins
import os
import select
import subprocess
import threading
import time
from pathlib import Path

from lab_utils.grading.wire import WireError, decode, dumps, encode, loads

from .sandbox import LOG_CAP_BYTES, Sandbox, _drain, guarded, kill_tree, tree_memory_mb

# remote exceptions re-raised here as themselves, so checks can catch what they expect
_BUILTIN_ERRORS = {
    name: getattr(builtins, name)
    for name in (
        "AssertionError",
        "AttributeError",
        "IndexError",
        "KeyError",
        "LookupError",
        "NotImplementedError",
        "OverflowError",
        "RecursionError",
        "StopIteration",
        "TypeError",
        "ValueError",
        "ZeroDivisionError",
        "ArithmeticError",
        "RuntimeError",
        "MemoryError",
    )
}


class RunnerFailed(BaseException):
    """The runner died, hung, ran out of memory or broke the protocol: the question scores zero."""


class UsesReference(BaseException):
    """The learner's code called, or is, a reference the question forbids (raised inside the sandbox).

    Like RunnerFailed, not an Exception: a check's `except Exception` must not swallow it."""


class LearnerError(Exception):
    """An exception the learner's code raised that is not one of the builtin kinds above."""

    def __init__(self, type_name: str, message: str, text: str):
        super().__init__(text or f"{type_name}: {message}")
        self.type_name = type_name


class Runner:
    """One sandboxed runner process serving one question's answers."""

    def __init__(
        self,
        answers_dir: Path,
        forbid: list[str],
        sandbox: Sandbox | None,
        python: str,
        env: dict,
        log: Path,
        timeout: float = 120,
        memory_mb: int = 4096,
        library: Path | None = None,
        prints: dict[str, str] | None = None,
    ):
        self.deadline = time.monotonic() + timeout
        self.timeout = timeout
        self.memory_mb = memory_mb
        self._mirrors: dict[int, tuple[int, object]] = {}  # id(obj) -> (mirror number, obj kept alive)
        # every folder a runner is handed is bound at its own path: its mount table names no other
        cmd = [python, "-m", "lab_utils.grading.sandboxed", "--answers", str(answers_dir)]
        if sandbox is not None:
            sandbox.read_only[str(answers_dir)] = str(answers_dir)
        if prints:  # the references' code fingerprints (grader.library): hashes, no source
            from .library import prints_file

            path = prints_file(prints)
            cmd += ["--prints", str(path)]
            if sandbox is not None:
                sandbox.read_only[str(path)] = str(path)
        cmd += ["--forbid", *forbid]
        if library is not None:  # the course library without this question's references
            if sandbox is not None:  # over the learner's copy of the library
                sandbox.read_only[str(library / "lab_utils")] = str(
                    Path(sandbox.course_folder()) / "lab_utils"
                )
            else:
                env = {
                    **env,
                    "PYTHONPATH": os.pathsep.join(filter(None, [str(library), env.get("PYTHONPATH")])),
                }
        if sandbox is not None:
            cmd = sandbox.wrap(cmd, env)
        self.proc = subprocess.Popen(
            guarded(cmd),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,  # through a pipe this process drains into the log, capped
            env=env,
            cwd=str(log.parent),
            start_new_session=True,
        )
        self._stderr = threading.Thread(
            target=_drain, args=(self.proc.stderr, log, LOG_CAP_BYTES), daemon=True
        )
        self._stderr.start()
        self._buf = b""
        self._next_memory_check = 0.0
        ready = self._reply()
        if "err" in ready:
            err = ready["err"]
            raise RunnerFailed(f"the answers could not be loaded: {err.get('text') or err.get('msg')}"[:300])

    # --- transport ---

    def _read_line(self) -> bytes:
        from lab_utils.grading.wire import MAX_LINE

        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            now = time.monotonic()
            left = self.deadline - now
            if left <= 0:
                raise RunnerFailed(f"the answer took longer than {self.timeout:.0f} s")
            # the memory of the runner's tree, read at most every 0.5 s: not once per reply, since a
            # hidden check may make thousands of calls
            if self.memory_mb and now >= self._next_memory_check:
                self._next_memory_check = now + 0.5
                if tree_memory_mb(self.proc.pid) > self.memory_mb:
                    raise RunnerFailed(f"the answer used more than {self.memory_mb} MB")
            ready, _, _ = select.select([fd], [], [], min(left, 0.5))
            if not ready:
                continue
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                raise RunnerFailed("the answer's process exited (os._exit, a crash, or a kill)")
            self._buf += chunk
            if len(self._buf) > MAX_LINE and b"\n" not in self._buf:
                raise RunnerFailed("the answer sent a reply over the size limit")
        line, _, self._buf = self._buf.partition(b"\n")
        return line

    def _reply(self) -> dict:
        try:
            return loads(self._read_line())
        except WireError as exc:
            raise RunnerFailed(f"malformed reply from the answer's process: {exc}") from None

    def request(self, message: dict):
        try:
            self.proc.stdin.write(dumps(message))
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise RunnerFailed("the answer's process exited") from None
        reply = self._reply()
        if "ok" in reply:
            try:
                return decode(reply["ok"], self._from_tag)
            except WireError as exc:
                raise RunnerFailed(f"malformed reply from the answer's process: {exc}") from None
        err = reply.get("err")
        if not isinstance(err, dict):
            raise RunnerFailed("malformed reply from the answer's process")
        kind, msg, text = str(err.get("type", "")), str(err.get("msg", "")), str(err.get("text", ""))
        if kind == "UsesReference":
            raise UsesReference(msg)
        if kind in ("SystemExit", "KeyboardInterrupt"):
            raise LearnerError(kind, msg, text)
        cls = _BUILTIN_ERRORS.get(kind)
        if cls is not None:
            exc = cls(msg)
            exc.from_learner = True  # the judge shows only its type where a hidden case caused it
            raise exc
        raise LearnerError(kind, msg, text)

    def _from_tag(self, data: dict):
        if data.get("$t") == "handle":
            try:
                hid = int(data["id"])
            except (KeyError, TypeError, ValueError):
                raise WireError("a handle without a number") from None
            kind = str(data.get("kind", "object"))
            cls = {"class": RemoteClass, "callable": RemoteCallable}.get(kind, Remote)
            return cls(self, hid, str(data.get("type", "object"))[:80])
        raise WireError(f"unknown tag {data.get('$t')!r}")

    def _to_wire(self, value):
        def handle(obj):
            if isinstance(obj, Remote):
                if object.__getattribute__(obj, "_runner") is not self:
                    raise TypeError("a proxy from another runner")
                return {"$t": "handle", "id": object.__getattribute__(obj, "_id")}
            import cloudpickle

            mirror = None
            if hasattr(obj, "__dict__") and not isinstance(obj, type) and not callable(obj):
                mirror, _ = self._mirrors.setdefault(id(obj), (len(self._mirrors) + 1, obj))
            return {"$t": "pickle", "v": base64.b64encode(cloudpickle.dumps(obj)).decode(), "mirror": mirror}

        return encode(value, handle, plain_only=True)

    # --- the API checks use ---

    def answer(self, name: str):
        return self.request({"op": "answer", "name": name})

    def close(self) -> None:
        try:
            kill_tree(self.proc.pid)
            self.proc.wait(timeout=10)
        except Exception:
            pass
        finally:
            for stream in (self.proc.stdin, self.proc.stdout):
                try:
                    stream.close()
                except Exception:
                    pass
            self._stderr.join(timeout=5)


class Remote:
    """An object that lives in the sandbox. Every use is one request; results are plain data or
    further proxies."""

    __slots__ = ("_runner", "_id", "_type")

    def __init__(self, runner: Runner, hid: int, type_name: str):
        object.__setattr__(self, "_runner", runner)
        object.__setattr__(self, "_id", hid)
        object.__setattr__(self, "_type", type_name)

    def _ask(self, op: str, **fields):
        runner = object.__getattribute__(self, "_runner")
        return runner.request({"op": op, "h": object.__getattribute__(self, "_id"), **fields})

    def __getattr__(self, name: str):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return self._ask("getattr", name=name)

    def _lab_run_inside(self, fn, args, kwargs):
        """lab_utils.grading.checks.inside: run course function `fn` in this proxy's sandbox."""
        runner = object.__getattribute__(self, "_runner")
        spec = f"{fn.__module__}:{fn.__qualname__}"
        return runner.request(
            {
                "op": "library",
                "fn": spec,
                "args": [runner._to_wire(a) for a in args],
                "kwargs": {str(k): runner._to_wire(v) for k, v in kwargs.items()},
            }
        )

    def __setattr__(self, name: str, value) -> None:
        runner = object.__getattribute__(self, "_runner")
        self._ask("setattr", name=name, value=runner._to_wire(value))

    def __call__(self, *args, **kwargs):
        runner = object.__getattribute__(self, "_runner")
        return self._ask(
            "call",
            args=[runner._to_wire(a) for a in args],
            kwargs={str(k): runner._to_wire(v) for k, v in kwargs.items()},
        )

    def __getitem__(self, key):
        runner = object.__getattribute__(self, "_runner")
        return self._ask("getitem", key=runner._to_wire(key))

    def __len__(self) -> int:
        n = self._ask("len")
        if type(n) is not int or n < 0:
            raise TypeError("len() of the answer is not a non-negative int")
        return n

    def __contains__(self, item) -> bool:
        runner = object.__getattribute__(self, "_runner")
        return bool(self._ask("contains", item=runner._to_wire(item)) is True)

    def __iter__(self):
        items = self._ask("iter")
        if not isinstance(items, list):
            raise TypeError("iterating the answer did not give a list of items")
        return iter(items)

    def _convert(self, to: str, want: type):
        value = self._ask("convert", to=to)
        if type(value) is not want and not (want is float and type(value) is int):
            raise TypeError(f"{to}() of the answer is not a {want.__name__}")
        return value

    def __int__(self) -> int:
        return self._convert("int", int)

    def __index__(self) -> int:
        return self._convert("index", int)

    def __float__(self) -> float:
        return float(self._convert("float", float))

    def __bool__(self) -> bool:
        return self._convert("bool", bool)

    def __str__(self) -> str:
        return self._convert("str", str)

    def __repr__(self) -> str:
        return f"<learner {object.__getattribute__(self, '_type')} in the sandbox>"

    def __hash__(self) -> int:
        return hash((id(object.__getattribute__(self, "_runner")), object.__getattribute__(self, "_id")))

    def __eq__(self, other) -> bool:
        # identity only: a learner's __eq__ never decides a comparison on the judge's side
        return isinstance(other, Remote) and hash(self) == hash(other)


class RemoteCallable(Remote):
    """A learner's function (or other callable) in the sandbox."""

    __slots__ = ()


class RemoteClass(RemoteCallable):
    """A learner's class in the sandbox; calling it makes an instance there."""

    __slots__ = ()
