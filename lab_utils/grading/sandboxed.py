"""The runner: calls a learner's saved answers inside the grader's sandbox, on the judge's request.

    python -m lab_utils.grading.sandboxed --answers DIR [--forbid module:attr ...]

The judge (outside the sandbox) writes one JSON request per line to stdin and reads one JSON reply
per line (wire.py). It asks for an answer by name, then for calls, attributes, items, lengths or
conversions of what came back; objects that cannot travel as plain data stay here and the judge
holds a numbered handle to them. Nothing the learner's code returns leaves this process except as
plain data.

Before any answer is loaded, each reference the question forbids is replaced, everywhere in the
course library, by a stand-in that raises `UsesReference` when learner code calls it (course code
that uses it internally still works). An answer that *is* the reference, wraps it, subclasses it or
calls it therefore fails here, where the judge cannot be fooled about it.

What the learner's code prints goes to stderr (a size-capped log); the replies go to a private copy
of the original stdout.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import os
import sys
import traceback

from .wire import WireError, decode, dumps, encode, loads

_LIB = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # .../lab_utils
_GRADING = os.path.join(_LIB, "grading")
MAX_ITEMS = 1_000_000  # items one `iter` request materialises


class UsesReference(Exception):
    """Learner code called (or is) a reference implementation the question forbids."""


def _library_caller(depth: int = 2) -> bool:
    """True when the code that called the guarded function is course code (not the runner, not a
    question file, not the learner's)."""
    try:
        path = os.path.abspath(sys._getframe(depth).f_code.co_filename)
    except ValueError:
        return False
    return path.startswith(_LIB + os.sep) and not path.startswith(_GRADING + os.sep)


def _guard_function(fn, spec: str):
    @functools.wraps(fn)
    def stand_in(*args, **kwargs):
        if not _library_caller():
            raise UsesReference(spec)
        return fn(*args, **kwargs)

    stand_in.__wrapped__ = None  # no way back to the reference through the stand-in
    stand_in._lab_forbidden = spec
    return stand_in


def _guard_class(cls: type, spec: str) -> type:
    namespace: dict = {"__module__": cls.__module__, "__qualname__": cls.__qualname__, "__doc__": cls.__doc__}
    for klass in cls.__mro__:
        if klass is object:
            continue
        for name, value in vars(klass).items():
            if name in namespace or name in (
                "__dict__",
                "__weakref__",
                "__module__",
                "__qualname__",
                "__doc__",
            ):
                continue
            if isinstance(value, staticmethod):
                namespace[name] = staticmethod(_guard_function(value.__func__, spec))
            elif isinstance(value, classmethod):
                namespace[name] = classmethod(_guard_function(value.__func__, spec))
            elif callable(value) and hasattr(value, "__code__"):
                namespace[name] = _guard_function(value, spec)
    if "__init__" not in namespace:

        def __init__(self, *args, **kwargs):
            if not _library_caller():
                raise UsesReference(spec)
            super(guarded, self).__init__(*args, **kwargs)

        namespace["__init__"] = __init__
    namespace["_lab_forbidden"] = spec
    guarded = type(cls.__name__, (cls,), namespace)
    return guarded


def reference_in(value) -> str | None:
    """The forbidden reference an answer *is* (itself, a partial of it, a bound method of it, or a
    subclass of it), or None. Course code may call a reference; an answer may not be one, even when
    only course code calls it (a scheduler handed to the simulator)."""
    seen = 0
    while value is not None and seen < 10:
        seen += 1
        spec = getattr(value, "_lab_forbidden", None) if isinstance(value, type) or callable(value) else None
        if isinstance(spec, str):
            return spec
        if isinstance(value, type):
            for base in value.__mro__[1:]:
                spec = vars(base).get("_lab_forbidden")
                if isinstance(spec, str):
                    return spec
            return None
        value = getattr(value, "func", None) or getattr(value, "__func__", None)
    return None


def forbid(specs: list[str]) -> None:
    """Replace each "module:attr" reference, wherever the course library holds it, by a guard."""
    for spec in specs:
        module_name, _, attr = spec.partition(":")
        module = importlib.import_module(module_name)
        owner, name = module, attr
        if "." in attr:  # a method: module:Class.method
            head, _, name = attr.rpartition(".")
            for part in head.split("."):
                owner = getattr(owner, part)
        original = getattr(owner, name)
        if isinstance(original, property):  # a property (ModelSpec.num_params): guard its getter
            guarded = property(_guard_function(original.fget, spec), doc=original.__doc__)
        elif isinstance(original, type):
            guarded = _guard_class(original, spec)
        else:
            guarded = _guard_function(original, spec)
        # the course library's copies, and a foreign package's own submodules that hold the same
        # object (numpy.percentile is also numpy.lib._function_base_impl.percentile)
        root = module_name.split(".")[0]
        for mod in list(sys.modules.values()):
            mod_name = getattr(mod, "__name__", "")
            if not isinstance(mod_name, str) or not (
                mod_name.startswith("lab_utils") or mod_name.split(".")[0] == root
            ):
                continue
            for key, value in list(vars(mod).items()):
                if value is original:
                    try:
                        setattr(mod, key, guarded)
                    except (AttributeError, TypeError):
                        pass
        if owner is not module:
            setattr(owner, name, guarded)
        elif not module_name.startswith("lab_utils"):  # numpy:percentile: the module's own name too
            setattr(module, name, guarded)


class Runner:
    """Answers, handles and the mirrors of objects the judge sent in."""

    def __init__(self, answers: dict, problems: dict[str, str]):
        self.answers = answers
        self.problems = problems
        self.handles: dict[int, object] = {}
        self.mirrors: dict[int, object] = {}

    def handle(self, value) -> dict:
        hid = len(self.handles) + 1
        self.handles[hid] = value
        kind = "class" if isinstance(value, type) else "callable" if callable(value) else "object"
        return {"$t": "handle", "id": hid, "kind": kind, "type": type(value).__name__[:80]}

    def out(self, value):
        return encode(value, self.handle)

    def _tag(self, data: dict):
        tag = data.get("$t")
        if tag == "handle":
            try:
                return self.handles[int(data["id"])]
            except (KeyError, ValueError, TypeError):
                raise WireError("unknown handle") from None
        if tag == "pickle":
            import base64

            import cloudpickle

            obj = cloudpickle.loads(base64.b64decode(data["v"]))
            mirror = data.get("mirror")
            if mirror is None:
                return obj
            known = self.mirrors.get(int(mirror))
            if known is None or type(known) is not type(obj) or not hasattr(obj, "__dict__"):
                self.mirrors[int(mirror)] = obj
                return obj
            known.__dict__.clear()
            known.__dict__.update(obj.__dict__)  # the judge's object changed since: same identity, new state
            return known
        raise WireError(f"unknown tag {tag!r}")

    def arg(self, data):
        return decode(data, self._tag)

    def target(self, request: dict):
        return self.arg({"$t": "handle", "id": request.get("h")})

    def serve(self, request: dict):
        op = request.get("op")
        if op == "answer":
            name = str(request.get("name"))
            if name not in self.answers:
                why = self.problems.get(name, "was not saved (define it and run its cell)")
                raise LookupError(f"`{name}` {why}")
            if spec := reference_in(self.answers[name]):
                raise UsesReference(spec)
            return self.out(self.answers[name])
        if op == "library":  # a course function driving the learner's answers (checks.inside)
            module_name, _, qualname = str(request.get("fn", "")).partition(":")
            if not module_name.startswith("lab_utils.") or module_name == __name__ or "<" in qualname:
                raise WireError(f"not a course function: {request.get('fn')!r}")
            fn = importlib.import_module(module_name)
            for part in qualname.split("."):
                fn = getattr(fn, part)
            args = [self.arg(a) for a in request.get("args", [])]
            kwargs = {str(k): self.arg(v) for k, v in request.get("kwargs", {}).items()}
            return self.out(fn(*args, **kwargs))
        obj = self.target(request)
        if op == "call":
            args = [self.arg(a) for a in request.get("args", [])]
            kwargs = {str(k): self.arg(v) for k, v in request.get("kwargs", {}).items()}
            return self.out(obj(*args, **kwargs))
        if op == "getattr":
            return self.out(getattr(obj, str(request["name"])))
        if op == "setattr":
            setattr(obj, str(request["name"]), self.arg(request.get("value")))
            return None
        if op == "getitem":
            return self.out(obj[self.arg(request.get("key"))])
        if op == "len":
            return int(len(obj))
        if op == "contains":
            return bool(self.arg(request.get("item")) in obj)
        if op == "iter":
            items = []
            for item in obj:
                items.append(item)
                if len(items) > MAX_ITEMS:
                    raise ValueError(f"more than {MAX_ITEMS} items")
            return self.out(items)
        if op == "convert":
            to = request.get("to")
            conv = {"int": int, "float": float, "index": lambda x: x.__index__(), "bool": bool, "str": str}
            if to not in conv:
                raise WireError(f"cannot convert to {to!r}")
            value = conv[to](obj)
            if to == "str":
                value = str(value)[:100_000]
            return self.out(value)
        if op == "hasattr":
            return hasattr(obj, str(request["name"]))
        raise WireError(f"unknown op {op!r}")


def _error(exc: BaseException) -> dict:
    if isinstance(exc, UsesReference):
        return {"type": "UsesReference", "msg": str(exc)}
    last = traceback.format_exception_only(type(exc), exc)[-1].strip()
    return {"type": type(exc).__name__[:80], "msg": str(exc)[:500], "text": last[:500]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--answers", required=True)
    parser.add_argument("--forbid", nargs="*", default=[])
    parser.add_argument("--log-limit-mb", type=int, default=64)
    args = parser.parse_args(argv)

    import resource

    cap = args.log_limit_mb * 2**20
    resource.setrlimit(resource.RLIMIT_FSIZE, (cap, cap))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    replies = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)  # what learner code prints goes to the log, not into the replies
    sys.stdout = sys.stderr
    requests = sys.stdin.buffer

    ready: dict = {"ok": True}
    try:
        forbid(args.forbid)
        from .probe import load_answers

        answers, problems = load_answers(args.answers)
    except BaseException as exc:
        answers, problems = {}, {}
        ready = {"err": _error(exc)}
    replies.write(dumps(ready))
    runner = Runner(answers, problems)
    while True:
        line = requests.readline(64 * 2**20)
        if not line:
            return 0
        try:
            reply = {"ok": runner.serve(loads(line))}
            data = dumps(reply)
        except BaseException as exc:  # SystemExit and KeyboardInterrupt from learner code too
            data = dumps({"err": _error(exc)})
        replies.write(data)


if __name__ == "__main__":
    sys.exit(main())
