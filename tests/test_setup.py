"""`make setup` prepares every lab; a lab opened after a partial set-up says what is missing."""

from __future__ import annotations

import sys

import pytest

from lab_utils import setup
from lab_utils.grading.safe_ast import without_magics


def test_after_make_setup_every_step_is_ready():
    # `make test` runs `make setup` first, so on CI this is the state a newcomer gets from `make lab`
    assert setup.missing_steps() == [], "run `make setup`: " + ", ".join(setup.missing_steps())


def test_a_missing_step_is_reported_with_what_to_do(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("TRITON_VENV", str(tmp_path / "nowhere"))
    assert setup.missing_steps() == ["triton-env"]
    assert setup.report_setup() is False
    out = capsys.readouterr().out
    assert "MISSING  triton-env" in out and "make setup" in out


def test_run_step_streams_progress_and_reports_done(monkeypatch, tmp_path):
    flag = tmp_path / "done"
    step = setup.Step(
        "demo",
        "a demo step",
        flag.exists,
        lambda: [sys.executable, "-c", f"print('working'); open({str(flag)!r}, 'w').close()"],
    )
    monkeypatch.setitem(setup.STEPS, "demo", step)
    lines: list[str] = []
    assert setup.missing_steps(["demo"]) == ["demo"]
    assert setup.run_step("demo", progress=lines.append) is True
    assert any("working" in line for line in lines) and lines[-1].startswith("[demo] ready")
    assert setup.missing_steps(["demo"]) == []


def test_unknown_step_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown set-up steps"):
        setup.missing_steps(["gpu-drivers"])


def _named_steps(setup_src: str) -> list[str]:
    """The steps a setup cell's report_setup(...) call checks: its literal list, or every step."""
    import ast

    code = without_magics(setup_src)
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "report_setup":
            return list(ast.literal_eval(node.args[0])) if node.args else list(setup.STEPS)
    raise AssertionError("no report_setup call")


def test_named_steps_reads_the_call():
    assert _named_steps("report_setup()") == list(setup.STEPS)
    assert _named_steps("x = 1\nreport_setup(['model'])") == ["model"]
    assert _named_steps("report_setup([])") == []


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_every_labs_setup_cell_reports_ready(repo):
    """Fresh clone + `make setup` alone: each lab's setup cell says every step is ready.

    Runs only the parameters and setup cells of each solution (one kernel for all labs)."""
    import nbformat
    from nbclient import NotebookClient

    from lab_utils.gpu_mode import lab_notebooks, setup_cells

    combined = nbformat.v4.new_notebook()
    slots, slots_src = {}, {}
    for path in lab_notebooks(repo / "solutions"):
        params, setup_src = setup_cells(nbformat.read(str(path), as_version=4))
        assert "report_setup(" in setup_src, f"{path.name}: the setup cell should call report_setup()"
        combined.cells += [
            nbformat.v4.new_code_cell("%reset -f"),
            nbformat.v4.new_code_cell(params),
            nbformat.v4.new_code_cell('BACKEND, LIGHT, RUN_VLLM, RUN_REAL = "cpu", True, False, False'),
            nbformat.v4.new_code_cell(setup_src),
        ]
        slots[path.name] = len(combined.cells) - 1
        slots_src[path.name] = setup_src
    NotebookClient(
        combined,
        timeout=300,
        kernel_name="python3",
        allow_errors=True,
        resources={"metadata": {"path": str(repo / "solutions")}},
    ).execute()
    for name, i in slots.items():
        outputs = combined.cells[i].get("outputs", [])
        errors = [o for o in outputs if o.get("output_type") == "error"]
        assert not errors, f"{name}: setup cell raised {errors[0].get('ename')}: {errors[0].get('evalue')}"
        text = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
        needs = _named_steps(slots_src[name])
        assert "MISSING" not in text, f"{name}: a set-up step is missing:\n{text[-800:]}"
        if not needs:
            assert "no set-up step" in text, f"{name}: the setup cell should say it needs no set-up:\n{text}"
        for step in needs:
            assert f"ready    {step}:" in text, (
                f"{name}: set-up step {step} not reported ready:\n{text[-800:]}"
            )


def test_the_course_environment_has_no_rfc3987_parser_to_build():
    """scripts/install_course_env.sh removes rfc3987-syntax: with it, every `import jsonschema`
    (nbformat, papermill, ray, each vLLM process) builds an Earley parser, 1.7 s of CPU
    (bench/import_cpu.py). jsonschema's other format checks stay."""
    import importlib.util

    import jsonschema

    assert importlib.util.find_spec("rfc3987_syntax") is None, "run scripts/install_course_env.sh again"
    checker = jsonschema.Draft202012Validator.FORMAT_CHECKER
    assert checker.conforms("2026-12-07", "date") and not checker.conforms("2026-13-07", "date")


def test_a_graded_runs_home_gets_the_vllm_model_info_cache(tmp_path, monkeypatch):
    """lab_utils.grading.execute copies the grader's vLLM model-info files into the run's new home,
    where vLLM looks; links, other files and oversized files are left behind, and a missing source
    or a VLLM_CACHE_ROOT of the run's own copies nothing."""
    from lab_utils.grading.execute import _seed_vllm_model_info

    monkeypatch.delenv("VLLM_CACHE_ROOT", raising=False)
    src, home = tmp_path / "modelinfos", tmp_path / "home"
    src.mkdir()
    (src / "vllm-model_executor-models-llama-LlamaForCausalLM.json").write_text('{"hash": "x"}')
    (src / "notes.txt").write_text("not a model-info file")
    (src / "big.json").write_bytes(b" " * (2 << 20))
    (tmp_path / "secret.json").write_text("{}")
    (src / "link.json").symlink_to(tmp_path / "secret.json")
    assert _seed_vllm_model_info(str(home), str(src)) == 1
    dest = home / ".cache" / "vllm" / "modelinfos"
    assert sorted(p.name for p in dest.iterdir()) == [
        "vllm-model_executor-models-llama-LlamaForCausalLM.json"
    ]
    assert _seed_vllm_model_info(str(tmp_path / "h2"), str(tmp_path / "nowhere")) == 0
    assert _seed_vllm_model_info(str(tmp_path / "h3"), None) == 0
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "own"))
    assert _seed_vllm_model_info(str(tmp_path / "h4"), str(src)) == 0
    assert not (tmp_path / "h2").exists() and not (tmp_path / "h4").exists()


def test_the_sandbox_shows_the_vllm_model_info_cache_when_there_is_one(tmp_path, monkeypatch):
    from grader import sandbox

    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "vllm"))
    assert sandbox.vllm_model_info_dir() is None and "vllm model info" not in sandbox.course_roots()
    (tmp_path / "vllm" / "modelinfos").mkdir(parents=True)
    assert sandbox.course_roots()["vllm model info"] == str(tmp_path / "vllm" / "modelinfos")
