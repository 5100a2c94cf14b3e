"""The judge and its sandboxed runner on toy answers (no notebook runs; each case takes about a second).

What comes back from the sandbox is plain data or a proxy; learner exceptions arrive as their
builtin kinds; a forbidden reference refuses learner callers however it is reached; a runner that
hangs, exits, floods or sends malformed replies fails its own question only; nothing a learner's
object does on unpickling ever runs on the judge's side.
"""

from __future__ import annotations

import dataclasses
import sys
import textwrap
from pathlib import Path

import cloudpickle
import pytest

from grader.judge import Context, judge_question
from grader.remote import Remote, Runner, RunnerFailed, UsesReference
from grader.sandbox import Sandbox, guarded, sandbox_problem
from lab_utils.grading.registry import Question
from lab_utils.kv.workload import WorkloadRequest

pytestmark = pytest.mark.skipif(bool(sandbox_problem()), reason=sandbox_problem() or "no sandbox")


def _answers(folder: Path, source: str) -> Path:
    """Define the answers in `source` as a notebook would (module __main__) and save them."""
    namespace: dict = {"__name__": "__main__"}
    exec(compile(textwrap.dedent(source), "<notebook>", "exec"), namespace)
    folder.mkdir(parents=True, exist_ok=True)
    main = sys.modules["__main__"]
    saved = {k: v for k, v in namespace.items() if not k.startswith("__")}
    for name, value in saved.items():
        if callable(value) and getattr(value, "__module__", None) == "__main__":
            value.__module__ = "__main__"
        (folder / f"{name}.pkl").write_bytes(cloudpickle.dumps(value))
    assert main is sys.modules["__main__"]
    return folder


def _runner(folder: Path, tmp_path: Path, forbid=(), timeout=20.0) -> Runner:
    env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8"}
    box = Sandbox(hide=[str(tmp_path / "secret")])
    return Runner(folder, list(forbid), box, sys.executable, env, tmp_path / "runner.log", timeout=timeout)


def test_values_come_back_as_plain_data_and_objects_as_proxies(tmp_path):
    folder = _answers(
        tmp_path / "a",
        """
        import numpy as np
        from lab_utils.kv.workload import WorkloadRequest
        def f(x):
            return {"n": x + 1, "t": (1, 2.5), "arr": np.arange(3), "nan": float("nan"), 7: "seven"}
        def req():
            return WorkloadRequest("a", 0, 10, 5, 20)
        class Counter:
            def __init__(self, start):
                self.n = start
            def add(self, k):
                self.n += k
                return self
        def bad(x):
            raise ValueError(f"no {x}")
        def stub():
            raise NotImplementedError
        """,
    )
    r = _runner(folder, tmp_path)
    try:
        out = r.answer("f")(41)
        assert out["n"] == 42 and out["t"] == (1, 2.5) and out[7] == "seven" and out["nan"] != out["nan"]
        assert list(out["arr"]) == [0, 1, 2]
        w = r.answer("req")()
        assert type(w) is WorkloadRequest and dataclasses.asdict(w)["prompt_len"] == 10
        counter = r.answer("Counter")(3)
        assert isinstance(counter, Remote) and int(counter.add(4).n) == 7
        with pytest.raises(ValueError, match="no 5"):
            r.answer("bad")(5)
        with pytest.raises(NotImplementedError):
            r.answer("stub")()
        with pytest.raises(LookupError):
            r.answer("missing")
    finally:
        r.close()


def test_a_forbidden_reference_refuses_learner_callers_however_reached(tmp_path):
    folder = _answers(
        tmp_path / "a",
        """
        import functools
        from lab_utils.kv.workload import max_concurrent_requests
        from lab_utils.kv import KVCacheManager
        same = max_concurrent_requests
        wrapped = functools.partial(max_concurrent_requests)
        def calls(*w):
            return max_concurrent_requests(*w)
        class Mine(KVCacheManager):
            pass
        """,
    )
    forbid = ["lab_utils.kv.workload:max_concurrent_requests", "lab_utils.kv.kv_cache_manager:KVCacheManager"]
    w = (10, 5, 20, 1000)
    for name in ("same", "wrapped", "Mine"):  # refused as soon as it is asked for, before any call:
        r = _runner(folder, tmp_path, forbid)  # course code handed the reference would call it freely
        try:
            with pytest.raises(UsesReference):
                r.answer(name)
        finally:
            r.close()
    for name, args in (("same", w), ("wrapped", w), ("calls", w), ("Mine", (8, 4))):
        r = _runner(folder, tmp_path, forbid)
        try:
            with pytest.raises(UsesReference):
                r.answer(name)(*args)
        finally:
            r.close()


class _RunsOnLoad:
    """Unpickled, it calls numpy's percentile: learner code that runs while the runner loads it."""

    def __reduce__(self):
        import numpy

        return (numpy.percentile, ([1.0, 2.0, 3.0], 50))


def test_an_answer_that_runs_a_reference_while_loaded_is_refused_each_time_asked(tmp_path):
    """The runner unpickles an answer when the judge first asks for it, under the watch."""
    folder = _answers(tmp_path / "a", "def other(x):\n    return x + 1\n")
    (folder / "loaded.pkl").write_bytes(cloudpickle.dumps(_RunsOnLoad()))
    (folder / "broken.pkl").write_bytes(b"not a pickle")
    r = _runner(folder, tmp_path, ["numpy:percentile"])
    try:
        for _ in range(2):
            with pytest.raises(UsesReference, match="percentile"):
                r.answer("loaded")
        assert r.answer("other")(1) == 2  # the other answers are untouched
        with pytest.raises(LookupError, match="could not be loaded"):
            r.answer("broken")
        with pytest.raises(LookupError, match="was not saved"):
            r.answer("../a/other")
    finally:
        r.close()


def test_a_reference_copy_run_while_loaded_is_refused_even_when_the_refusal_is_caught(tmp_path):
    """Unpickling calls a copy of a reference and swallows the refusal: the answer stays refused."""
    from lab_utils.grading.absent import fingerprint

    source = """
        def ref_copy(xs):  # long enough to be fingerprinted
            total, count = 0.0, 0
            for x in sorted(xs):
                total += x * x
                count += 1
            return (total / max(count, 1)) ** 0.5
        def swallow():
            try:
                ref_copy([1.0, 2.0])
            except BaseException:
                pass
            return 7
        class Loaded:
            def __reduce__(self):
                return (swallow, ())
        loaded = Loaded()
        """
    namespace: dict = {}
    exec(compile(textwrap.dedent(source), "<reference>", "exec"), namespace)
    prints = {fingerprint(namespace["ref_copy"].__code__): "tests:ref_copy"}
    folder = _answers(tmp_path / "a", source)
    env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8"}
    r = Runner(folder, [], Sandbox(hide=[]), sys.executable, env, tmp_path / "log", timeout=20, prints=prints)
    try:
        for _ in range(2):
            with pytest.raises(UsesReference, match="ref_copy"):
                r.answer("loaded")
    finally:
        r.close()


def test_a_forbidden_property_is_absent_for_course_code_too(tmp_path):
    """Course code that would read the reference for the answer (weight_bytes is num_params times
    the dtype's size) is a route to it: in the runner the reference is absent for everyone."""
    folder = _answers(
        tmp_path / "a",
        """
        from lab_utils.memory import ModelSpec, weight_bytes
        SPEC = dict(name="x", num_layers=2, hidden_size=64, num_attention_heads=4, num_kv_heads=2,
                    head_dim=16, intermediate_size=128, vocab_size=100)
        def reads():
            return ModelSpec(**SPEC).num_params
        def through_course_code():
            return weight_bytes(ModelSpec(**SPEC), "float32")
        def fields():
            return ModelSpec(**SPEC).num_layers
        """,
    )
    r = _runner(folder, tmp_path, ["lab_utils.memory.spec:ModelSpec.num_params"])
    try:
        with pytest.raises(UsesReference):
            r.answer("reads")()
        with pytest.raises(UsesReference):
            r.answer("through_course_code")()
        assert int(r.answer("fields")()) == 2
    finally:
        r.close()


def test_hangs_exits_floods_and_forged_replies_fail_their_question_only(tmp_path):
    folder = _answers(
        tmp_path / "a",
        """
        import os, time
        def hang(x):
            while True:
                time.sleep(1)
        def leave(x):
            os._exit(3)
        def flood(x):
            print("x" * 100_000_000)
            return 1
        def forge(x):
            for fd in range(3, 30):
                try:
                    os.write(fd, b'{"ok": {"$t": "pickle", "v": "AAAA"}}\\n')
                except OSError:
                    pass
            return 2
        def fine(x):
            return x * 2
        """,
    )
    q = lambda name: Question(
        f"96.{name}", 1.0, (name,), lambda **kw: None if int(next(iter(kw.values()))(3)) == 6 else 0
    )  # noqa: E731
    ctx = Context(
        answers_dir=folder,
        work=tmp_path,
        student="s",
        key="k",
        scenario={},
        sandbox=lambda: Sandbox(),
        python=sys.executable,
        env={"PATH": "/usr/bin:/bin", "HOME": "/tmp"},
        per_question=8,
    )
    statuses = {name: judge_question(q(name), ctx) for name in ("hang", "leave", "flood", "forge", "fine")}
    assert statuses["fine"].earned == 1.0, statuses["fine"]
    for name in ("hang", "leave", "flood", "forge"):
        assert statuses[name].earned == 0.0 and statuses[name].status in ("error", "not yet right"), statuses[
            name
        ]
    assert "longer than 8 s" in statuses["hang"].message


def test_nothing_is_unpickled_on_the_judges_side(tmp_path):
    marker = tmp_path / "ran-on-the-judge"
    folder = _answers(
        tmp_path / "a",
        f"""
        import os
        class Trap:
            def __reduce__(self):
                return (os.system, ("touch {marker}",))
        def give():
            return [Trap(), {{"x": Trap()}}]
        """,
    )
    r = _runner(folder, tmp_path)
    try:
        got = r.answer("give")()
        assert isinstance(got[0], Remote) and isinstance(got[1]["x"], Remote)
    finally:
        r.close()
    assert not marker.exists()


def test_a_runner_sees_no_host_folder_outside_the_allow_list(tmp_path):
    import shutil

    # outside /tmp (the sandbox's /tmp is private anyway), world-readable, in the repository: not on
    # the allow list, so it does not exist inside, hidden or not
    secret = Path(__file__).resolve().parent.parent / "out" / f"judge-secret-{tmp_path.name}"
    shutil.rmtree(secret, ignore_errors=True)
    secret.mkdir(parents=True)
    secret.chmod(0o755)
    (secret / "seed").write_text("12345")
    folder = _answers(
        tmp_path / "a",
        f"""
        def peek():
            import os
            for path in ({str(secret / "seed")!r}, {str(secret)!r}, {str(secret.parent.parent / "solutions")!r}):
                if os.path.exists(path):
                    return path
            return "absent"
        """,
    )
    env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp"}
    r = Runner(folder, [], Sandbox(), sys.executable, env, tmp_path / "log", timeout=20)
    try:
        assert r.answer("peek")() == "absent"
    finally:
        r.close()
        shutil.rmtree(secret, ignore_errors=True)


def test_runner_failed_is_not_an_exception_a_check_can_swallow():
    assert not issubclass(RunnerFailed, Exception) and not issubclass(UsesReference, Exception)


def test_a_checkout_under_tmp_is_bound_back_with_its_hidden_folders_still_hidden(tmp_path, monkeypatch):
    """The sandbox's /tmp is private; a course that lives under /tmp (a CI clone) must still be seen."""
    import subprocess

    from grader import sandbox as box_module

    repo = tmp_path / "repo"
    (repo / "grader").mkdir(parents=True)
    (repo / "grader" / "secret.py").write_text("KEY = 1\n")
    (repo / "lib.py").write_text("VISIBLE = 1\n")
    monkeypatch.setattr(box_module, "_needed", lambda: [str(repo)])
    box = Sandbox(hide=[str(repo / "grader")])
    cmd = guarded(box.wrap(["/bin/ls", str(repo), str(repo / "grader")], {"PATH": "/usr/bin:/bin"}))
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert "lib.py" in out.stdout and "secret.py" not in out.stdout
