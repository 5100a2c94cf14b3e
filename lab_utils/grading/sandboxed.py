"""The runner: calls a learner's saved answers inside the grader's sandbox, on the judge's request.

    python -m lab_utils.grading.sandboxed --answers DIR [--forbid module:attr ...] [--prints FILE]

The judge (outside the sandbox) writes one JSON request per line to stdin and reads one JSON reply
per line (wire.py). It asks for an answer by name, then for calls, attributes, items, lengths or
conversions of what came back; objects that cannot travel as plain data stay here and the judge
holds a numbered handle to them. Nothing the learner's code returns leaves this process except as
plain data.

The question's references are absent here, not watched:
- the course library this process imports is the judge's copy in which each course reference the
  question forbids is a stub that raises (grader/library.py, lab_utils.grading.absent); course
  code that would use one raises too;
- a third-party reference (`numpy:percentile`, `statistics:median`) is replaced, in every module
  that holds it, by a stub that raises and keeps nothing of the original;
- a *copy* of a reference brought in some other way (exec of its source, a module loaded by path,
  a reload of a third-party module, a cached `.pyc`, a copy of the grader's hidden reference) is
  known by its code fingerprint (`--prints`, computed by the judge from the real references): an
  answer that reaches such code, or runs it while the judge calls it, is refused. A C function
  (`torch.quantile`) is known by identity when called. Turning off the call watch is refused too.

What the learner's code prints goes to stderr (a size-capped log); the replies go to a private copy
of the original stdout.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import threading
import traceback

from .absent import MARK, UsesReference, fingerprint, reachable_codes, stub_spec
from .wire import WireError, decode, dumps, encode, loads

MAX_ITEMS = 1_000_000  # items one `iter` request materialises
TAMPER = "the grader's call watch"  # the spec reported when learner code turns the watch off
LAZY_ROOTS = ("vllm", "transformers")  # packages whose forbidden references are stubbed on import


def _stub(spec: str):
    """A function that raises UsesReference(spec) and holds nothing of the reference."""
    namespace: dict = {"UsesReference": UsesReference}
    exec(  # noqa: S102 - a fixed template, the spec as a constant
        f"def stub(*args, **kwargs):\n    raise UsesReference({MARK + spec!r})\n", namespace
    )
    return namespace["stub"]


def reference_in(value) -> str | None:
    """The forbidden reference an answer *is* (a stub, a partial or bound method of one, a class
    that is or derives from a stubbed class), or None."""
    spec = stub_spec(value)
    return spec[len(MARK) :] if spec and spec.startswith(MARK) else spec


class Watch:
    """The call watch: refuses any run of code whose fingerprint is a reference's, any call of a
    forbidden C function, and any attempt to turn the watch off."""

    def __init__(self, prints: dict[str, str], c_funcs: dict[int, str], c_methods: list[tuple]):
        self._prints = prints
        self._c_funcs = c_funcs
        self._c_methods = c_methods  # (owner class, name, spec)
        self._seen: dict[int, tuple[object, str | None]] = {}
        self._off = {id(sys.setprofile), id(sys.settrace), id(threading.setprofile), id(threading.settrace)}
        try:
            import _thread

            self._off.add(id(_thread.start_new_thread))
        except ImportError:
            pass
        # a thread started by threading.Thread.start inherits the watch (threading.setprofile)
        self._thread_start = threading.Thread.start.__code__
        self._bootstrap = threading.Thread._bootstrap_inner.__code__
        self.hit: str | None = None
        self.stopping = False

    def known(self, code) -> str | None:
        entry = self._seen.get(id(code))
        if entry is None or entry[0] is not code:
            entry = (code, self._prints.get(fingerprint(code) or "")) if self._prints else (code, None)
            self._seen[id(code)] = entry
        return entry[1]

    def __call__(self, frame, event, arg):
        if self.hit is not None:
            return
        if event == "call":
            spec = self.known(frame.f_code)
            if spec is not None:
                self.hit = spec
                raise UsesReference(MARK + spec)
        elif event == "c_call":
            if id(arg) in self._off:
                if (
                    frame.f_code is self._thread_start
                    and getattr(threading.Thread._bootstrap_inner, "__code__", None) is self._bootstrap
                    and threading._profile_hook is self
                ):
                    return
                if not self.stopping:
                    self.hit = TAMPER
                    raise UsesReference(MARK + TAMPER)
                return
            spec = self._c_funcs.get(id(arg))
            if spec is None and self._c_methods:
                owner = getattr(arg, "__self__", None)
                name = getattr(arg, "__name__", None)
                for cls, attr, s in self._c_methods:
                    if name == attr and isinstance(owner, cls):
                        spec = s
                        break
            if spec is not None:
                self.hit = spec
                raise UsesReference(MARK + spec)

    def start(self) -> None:
        self.hit = None
        self.stopping = False
        threading.setprofile(self)
        sys.setprofile(self)

    def stop(self) -> None:
        self.stopping = True
        if sys.getprofile() is not self and self.hit is None:
            self.hit = TAMPER
        sys.setprofile(None)
        threading.setprofile(None)


def forbid(specs: list[str]) -> tuple[dict[int, str], list[tuple]]:
    """Replace each "module:attr" reference that is still there (third-party ones; course ones are
    already stubs in this library) by a stub, wherever a loaded module holds it. Returns the
    C functions among them (by identity) and the C methods (by owner class and name), for the
    watch: both are filled in later for a module imported later.

    A reference in vLLM or transformers whose module is not imported yet is replaced the moment
    that module is imported (an import hook), before any code can take it from there: importing
    them only to forbid one of their functions cost each runner 4-8 s and 0.5 GB. Those references
    are Python code, so the watch knows them by fingerprint even if learner code removes the hook;
    a C function is known by identity only, so its module is imported at once."""
    c_funcs: dict[int, str] = {}
    c_methods: list[tuple] = []
    pending: dict[str, list[str]] = {}
    for spec in specs:
        module_name = spec.partition(":")[0]
        if module_name in sys.modules or module_name.split(".")[0] not in LAZY_ROOTS:
            _forbid_one(spec, c_funcs, c_methods)
        else:
            pending.setdefault(module_name, []).append(spec)
    if pending:
        sys.meta_path.insert(0, _ForbidOnImport(pending, c_funcs, c_methods))
    return c_funcs, c_methods


class _ForbidOnImport:
    """A meta-path finder that finds nothing itself: for a module with forbidden references it
    wraps the real loader so that the references are replaced as soon as the module has run."""

    def __init__(self, pending: dict[str, list[str]], c_funcs: dict, c_methods: list):
        self.pending, self.c_funcs, self.c_methods = pending, c_funcs, c_methods

    def find_spec(self, name, path=None, target=None):
        if name not in self.pending:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        specs, hook = self.pending[name], self

        class _Loader:
            def create_module(self, module_spec):
                return loader.create_module(module_spec)

            def exec_module(self, module):
                loader.exec_module(module)
                for s in specs:
                    _forbid_one(s, hook.c_funcs, hook.c_methods)

            def __getattr__(self, attr):  # get_data, get_filename, is_package, ...
                return getattr(loader, attr)

        spec.loader = _Loader()
        return spec


def _forbid_one(spec: str, c_funcs: dict[int, str], c_methods: list[tuple]) -> None:
    module_name, _, attr = spec.partition(":")
    module = sys.modules.get(module_name) or importlib.import_module(module_name)
    owner, name = module, attr
    if "." in attr:  # a method: module:Class.method
        head, _, name = attr.rpartition(".")
        for part in head.split("."):
            owner = getattr(owner, part)
    original = owner.__dict__.get(name, None) if isinstance(owner, type) else getattr(owner, name, None)
    if original is None:
        original = getattr(owner, name, None)
    if original is None:  # a method of a class already replaced whole
        return
    if stub_spec(original) or (isinstance(original, property) and stub_spec(original.fget)):
        return  # a course reference: absent from this library already
    if isinstance(original, type):
        stub = type(original.__name__, (), {"__lab_forbidden__": spec, "__new__": _stub(spec)})
    elif isinstance(original, property):
        stub = property(_stub(spec))
    else:
        stub = _stub(spec)
    if not hasattr(original, "__code__") and callable(original) and not isinstance(original, type):
        if isinstance(owner, type):
            c_methods.append((owner, name, spec))
        else:
            c_funcs[id(original)] = spec
    root = module_name.split(".")[0]
    for mod in list(sys.modules.values()):
        mod_name = getattr(mod, "__name__", "")
        if not isinstance(mod_name, str) or not (
            mod_name.startswith("lab_utils") or mod_name.split(".")[0] == root
        ):
            continue
        try:
            items = list(vars(mod).items())
        except TypeError:
            continue
        for key, value in items:
            if value is original:
                try:
                    setattr(mod, key, stub)
                except (AttributeError, TypeError):
                    pass
    try:
        setattr(owner, name, stub)
    except (AttributeError, TypeError):
        pass


class SavedAnswers:
    """The answers saved in a folder, each unpickled when the judge first asks for it, while the
    runner's watch is on: a runner serves one question, and unpickling every answer cost each
    runner the imports of all of them (an answer saved by reference to a vLLM function made each of
    lab 13's seven runners import vLLM, 20 s apiece). A reference that runs while an answer is
    unpickled refuses that answer for good, even when the learner's code caught the refusal."""

    def __init__(self, folder: str, watch: Watch | None = None):
        from pathlib import Path

        from .probe import not_saved

        self.folder, self.watch = Path(folder), watch
        self.problems: dict[str, str] = not_saved(self.folder)
        self.loaded: dict[str, object] = {}
        self.refused: dict[str, str] = {}

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str) or not name.isidentifier():
            return False
        if name in self.refused:
            raise UsesReference(MARK + self.refused[name])
        if name in self.loaded:
            return True
        path = self.folder / f"{name}.pkl"
        if name in self.problems or not path.is_file():
            return False
        import cloudpickle

        from .probe import not_loaded

        try:
            value = cloudpickle.loads(path.read_bytes())
        except UsesReference as exc:
            spec = str(exc)
            self.refused[name] = spec[len(MARK) :] if spec.startswith(MARK) else spec
            raise
        except Exception as exc:
            self.problems[name] = not_loaded(exc)
            return False
        if self.watch is not None and self.watch.hit is not None:  # refused, and the refusal caught
            self.refused[name] = self.watch.hit
            raise UsesReference(MARK + self.watch.hit)
        self.loaded[name] = value
        return True

    def __getitem__(self, name: str):
        if name not in self:
            raise KeyError(name)
        return self.loaded[name]


class Runner:
    """Answers, handles and the mirrors of objects the judge sent in."""

    def __init__(self, answers: SavedAnswers | dict, problems: dict[str, str], watch: Watch | None = None):
        self.answers = answers
        self.problems = problems
        self.watch = watch
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
                raise UsesReference(MARK + spec)
            if self.watch is not None:  # a copy of a reference, made anywhere, that the answer reaches
                for code in reachable_codes(self.answers[name]):
                    if spec := self.watch.known(code):
                        raise UsesReference(MARK + spec)
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


def _error(exc: BaseException, watch: Watch | None = None) -> dict:
    if watch is not None and watch.hit is not None:  # whatever the learner's code made of it
        return {"type": "UsesReference", "msg": watch.hit}
    if type(exc).__name__ == "UsesReference":
        msg = str(exc)
        return {"type": "UsesReference", "msg": msg[len(MARK) :] if msg.startswith(MARK) else msg}
    last = traceback.format_exception_only(type(exc), exc)[-1].strip()
    return {"type": type(exc).__name__[:80], "msg": str(exc)[:500], "text": last[:500]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--answers", required=True)
    parser.add_argument("--forbid", nargs="*", default=[])
    parser.add_argument("--prints", default=None, help="JSON {fingerprint: spec} of the references")
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
        c_funcs, c_methods = forbid(args.forbid)
        prints = {}
        if args.prints:
            with open(args.prints) as f:
                prints = {str(k): str(v) for k, v in json.load(f).items()}
        watch = Watch(prints, c_funcs, c_methods)
        answers = SavedAnswers(args.answers, watch)  # unpickled on demand, under the watch
        problems = answers.problems
    except BaseException as exc:
        answers, problems, watch = {}, {}, None
        ready = {"err": _error(exc)}
    replies.write(dumps(ready))
    runner = Runner(answers, problems, watch)
    while True:
        line = requests.readline(64 * 2**20)
        if not line:
            return 0
        try:
            request = loads(line)
            if watch is not None:
                watch.start()
            try:
                value = runner.serve(request)
            finally:
                if watch is not None:
                    watch.stop()
            if watch is not None and watch.hit is not None:
                raise UsesReference(MARK + watch.hit)
            data = dumps({"ok": value})
        except BaseException as exc:  # SystemExit and KeyboardInterrupt from learner code too
            data = dumps({"err": _error(exc, watch)})
        replies.write(data)


if __name__ == "__main__":
    sys.exit(main())
