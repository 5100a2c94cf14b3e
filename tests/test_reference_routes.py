"""Every route to a forbidden reference, tried against the judge's runner (issue 38 item 2).

The runner that judges a question imports a course library in which the question's references are
stubs (grader.library); copies of a reference made any other way are known by their code
fingerprints. Each test is one route a hostile learner with the full source took; each answer
must be refused (`UsesReference`) or at least fail, never return the reference's value.

The runner runs unsandboxed here (bubblewrap is not needed): the sandbox only adds that the
original library is not on disk at all. Each case starts one runner (about a second).
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import cloudpickle
import pytest

from grader.library import HIDDEN_LABEL, fingerprints, library_for
from grader.remote import Runner, UsesReference
from lab_utils.grading.registry import Question, get
from lab_utils.kv.workload import WorkloadRequest

# the forbidden reference every route tries to reach: lab 02's concurrency figure (called on W)
MAX_CONCURRENT = "lab_utils.kv.workload:max_concurrent_requests"
W = (10, 5, 20, 1000)  # prompt_len, output_len, max_tokens, capacity_tokens
WORKLOAD = [WorkloadRequest("a", 0, 10, 5, 20), WorkloadRequest("b", 1, 30, 10, 50)]


def _answers(folder: Path, source: str) -> Path:
    """Define the answers in `source` as a notebook would (module __main__) and save them."""
    namespace: dict = {"__name__": "__main__"}
    exec(compile(textwrap.dedent(source), "<notebook>", "exec"), namespace)
    folder.mkdir(parents=True, exist_ok=True)
    for name, value in namespace.items():
        if not name.startswith("__"):
            (folder / f"{name}.pkl").write_bytes(cloudpickle.dumps(value))
    return folder


def _question(forbid, qid="02.max_concurrent") -> Question:
    return Question(qid, 1.0, ("answer",), fn=lambda answer: None, forbid=tuple(forbid))


def _call(tmp_path, source: str, forbid=(MAX_CONCURRENT,), args=(W,), qid="02.max_concurrent"):
    """Call `answer(*args)` in a runner judging a question that forbids `forbid`."""
    folder = _answers(tmp_path / "answers", source)
    q = _question(forbid, qid)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8"}
    runner = Runner(
        folder,
        list(q.forbid),
        None,
        sys.executable,
        env,
        tmp_path / "runner.log",
        timeout=60,
        library=library_for(q.forbid),
        prints=fingerprints(q),
    )
    try:
        return runner.answer("answer")(*args)
    finally:
        runner.close()


def _refused(tmp_path, source: str, **kw) -> str:
    with pytest.raises(UsesReference) as info:
        _call(tmp_path, source, **kw)
    return str(info.value)


def test_an_honest_answer_runs_and_the_course_library_still_works(tmp_path):
    got = _call(
        tmp_path,
        """
        from lab_utils.kv.workload import WorkloadRequest
        def answer(w):
            return sum(r.prompt_len for r in w) + len([WorkloadRequest("x", 0, 1, 1, 2)])
        """,
        args=(WORKLOAD,),
    )
    assert got == 41


def test_calling_the_reference_is_refused(tmp_path):
    src = "from lab_utils.kv.workload import max_concurrent_requests\ndef answer(w):\n    return max_concurrent_requests(*w)\n"
    assert "max_concurrent_requests" in _refused(tmp_path, src)


def test_the_closure_of_the_stand_in_holds_nothing(tmp_path):
    src = """
    from lab_utils.kv.workload import max_concurrent_requests
    def answer(w):
        cells = max_concurrent_requests.__closure__ or ()
        real = [c.cell_contents for c in cells if callable(c.cell_contents)]
        return real[0](*w) if real else "no closure"
    """
    assert _call(tmp_path, src) == "no closure"


def test_compile_under_a_course_file_name_is_not_trusted(tmp_path):
    _refused(
        tmp_path,
        """
        import lab_utils.kv.workload as m
        def answer(w):
            ns = {}
            exec(compile("from lab_utils.kv.workload import max_concurrent_requests as f\\nout = f(*w)", m.__file__, "exec"),
                 {"w": w}, ns)
            return ns["out"]
        """,
    )


def test_reloading_the_module_gives_the_stub_again(tmp_path):
    _refused(
        tmp_path,
        """
        import importlib
        import lab_utils.kv.workload as m
        def answer(w):
            return importlib.reload(m).max_concurrent_requests(*w)
        """,
    )


def test_a_function_built_from_the_references_code_is_the_stub(tmp_path):
    _refused(
        tmp_path,
        """
        import types
        from lab_utils.kv.workload import max_concurrent_requests as f
        def answer(w):
            return types.FunctionType(f.__code__, f.__globals__)(*w)
        """,
    )


def test_exec_of_the_source_at_call_time_gives_the_stub(tmp_path):
    _refused(
        tmp_path,
        """
        import inspect
        import lab_utils.kv.workload as m
        def answer(w):
            ns = dict(vars(m))
            exec(inspect.getsource(m.max_concurrent_requests), ns)
            return ns["max_concurrent_requests"](*w)
        """,
    )


def test_a_runtime_copy_made_in_the_notebook_is_refused(tmp_path):
    """exec of inspect.getsource in the notebook (where the library is whole): the copy travels by
    value with the answer; its code is the reference's."""
    import inspect

    import lab_utils.kv.workload as m

    source = inspect.getsource(m.max_concurrent_requests)
    msg = _refused(
        tmp_path,
        f"""
        from lab_utils.kv.workload import *
        exec({source!r})
        def answer(w):
            return max_concurrent_requests(*w)
        """,
    )
    assert "max_concurrent_requests" in msg


def test_loading_the_original_file_by_path_is_caught_when_it_runs(tmp_path):
    """Unsandboxed the original file is on disk (the sandbox binds the stubbed copy over it)."""
    import lab_utils.kv.workload as m

    _refused(
        tmp_path,
        f"""
        import importlib.util, sys
        def answer(w):
            spec = importlib.util.spec_from_file_location("lab_utils.kv.copied_workload", {m.__file__!r})
            mod = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = mod
            spec.loader.exec_module(mod)
            return mod.max_concurrent_requests(*w)
        """,
    )


def test_sys_modules_and_sys_path_tricks_are_caught(tmp_path):
    repo = str(Path(__file__).resolve().parent.parent)
    _refused(
        tmp_path,
        f"""
        import importlib, sys
        def answer(w):
            sys.path.insert(0, {repo!r})
            for name in [n for n in sys.modules if n.startswith("lab_utils.kv")]:
                del sys.modules[name]
            sys.modules.pop("lab_utils", None)
            importlib.invalidate_caches()
            return importlib.import_module("lab_utils.kv.workload").max_concurrent_requests(*w)
        """,
    )


def test_pickling_the_reference_gives_the_stub(tmp_path):
    _refused(
        tmp_path,
        """
        import pickle
        from lab_utils.kv.workload import max_concurrent_requests
        def answer(w):
            return pickle.loads(pickle.dumps(max_concurrent_requests))(*w)
        """,
    )


def test_turning_the_watch_off_is_refused(tmp_path):
    msg = _refused(
        tmp_path,
        """
        import sys
        def answer(w):
            sys.setprofile(None)
            return 0.5
        """,
    )
    assert "watch" in msg


def test_reloading_a_standard_library_module_is_caught(tmp_path):
    _refused(
        tmp_path,
        """
        import importlib, statistics
        def answer(xs):
            return importlib.reload(statistics).median(xs)
        """,
        forbid=("statistics:median",),
        args=([1.0, 3.0, 2.0],),
    )


def test_a_pasted_hidden_reference_is_refused_without_naming_it(tmp_path):
    """The grader's own reference for a question (grader/hidden), pasted in by a learner who read it."""
    import inspect

    from grader.hidden import lab11

    q = get("11.critical_batch")
    ref = next(
        v
        for k, v in vars(lab11).items()
        if k.startswith("_ref")
        and callable(v)
        and v.__code__.co_filename == lab11.__file__
        and any(p == HIDDEN_LABEL for p in fingerprints(Question(q.id, 1, ("a",), fn=None)).values())
    )
    source = textwrap.dedent(inspect.getsource(ref))
    src = f"{source}\nanswer = {ref.__name__}\n"
    folder = _answers(tmp_path / "answers", src)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8"}
    runner = Runner(
        folder,
        list(q.forbid),
        None,
        sys.executable,
        env,
        tmp_path / "r.log",
        timeout=60,
        library=library_for(q.forbid),
        prints=fingerprints(q),
    )
    try:
        hidden_prints = {p for p, s in fingerprints(q).items() if s == HIDDEN_LABEL}
        from lab_utils.grading.absent import codes_of, fingerprint

        if not hidden_prints & {fingerprint(c) for c in codes_of(ref)}:
            pytest.skip(f"{ref.__name__} is not reached from 11.critical_batch's hidden check")
        with pytest.raises(UsesReference) as info:
            runner.answer("answer")
        assert str(info.value) == HIDDEN_LABEL and ref.__name__ not in str(info.value)
    finally:
        runner.close()


@pytest.mark.skipif(bool(__import__("grader.sandbox").sandbox.sandbox_problem()), reason="no sandbox")
def test_in_the_sandbox_the_original_source_is_not_on_disk(tmp_path):
    """The host's course library is not in the sandbox at all (its real path does not exist there),
    and the library the runner sees holds the stub: reading the module's own file gives the stub,
    and loading that file by path gives the stub too."""
    import lab_utils.kv.workload as m
    from grader.sandbox import Sandbox

    folder = _answers(
        tmp_path / "answers",
        f"""
        import importlib.util, os, sys
        import lab_utils.kv.workload as seen
        def answer(w):
            host = {m.__file__!r}
            assert not os.path.exists(host) or os.path.realpath(host) == os.path.realpath(seen.__file__), host
            text = open(seen.__file__).read()
            assert "def max_concurrent_requests(*args, **kwargs)" in text, "the original source is visible"
            spec = importlib.util.spec_from_file_location("lab_utils.kv.by_path", seen.__file__)
            mod = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = mod
            spec.loader.exec_module(mod)
            return mod.max_concurrent_requests(*w)
        """,
    )
    q = _question((MAX_CONCURRENT,))
    env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8"}
    runner = Runner(
        folder,
        list(q.forbid),
        Sandbox(),
        sys.executable,
        env,
        tmp_path / "r.log",
        timeout=60,
        library=library_for(q.forbid),
        prints=fingerprints(q),
    )
    try:
        with pytest.raises(UsesReference):
            runner.answer("answer")(W)
    finally:
        runner.close()
