#!/usr/bin/env python3
"""`make gpu-check`: prove the GPU mode on an NVIDIA machine, or check what a CPU machine can.

On a machine with an NVIDIA GPU (nvidia-smi lists one):
  1. installs requirements/course-gpu.txt into the course environment (`make venv GPU=1`; a
     `.venv` that already holds the CPU environment is left alone and `.venv-gpu` is used);
  2. prepares the course model (`python -m lab_utils.models`);
  3. runs labs 00, 01, 02, 04 and 05 headless through the course grader with BACKEND="gpu",
     LIGHT=True, each under a time limit drawn from one overall budget (default 690 s);
  4. prints one table: lab, mode detected, wall time, questions passed, and the figures the
     notebooks record (vLLM's KV capacity on the GPU, course engine vs vLLM tokens/s).
On a machine without one it says so, resolves requirements/course-gpu.txt for a Linux CUDA machine
against the package registry, and runs tests/test_gpu_mode.py (every lab's GPU branch stops with
the lab's own error when CUDA is absent).

Everything goes to one folder (default out/gpu-check/): summary.md, summary.json, log.txt, the
executed notebooks, and each lab's recorded variables. Exit status 0 when every check passed.

    python3 scripts/gpu_check.py [--out DIR] [--budget S] [--labs 00,01,02,04,05|all]
                                 [--python PY] [--skip-install]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_LABS = ["00", "01", "02", "04", "05"]
# seconds each lab may take on a GPU with LIGHT=True (vLLM start-ups dominate); capped by the budget
LAB_LIMITS = {"00": 90, "01": 180, "02": 150, "04": 90, "05": 300}
OTHER_LAB_LIMIT = 120
INSTALL_LIMIT = 420  # a cold install of vllm + CUDA torch downloads several GB
MODEL_LIMIT = 180

T0 = time.monotonic()
LOG = None


def say(msg: str = "") -> None:
    print(msg, flush=True)
    if LOG:
        with open(LOG, "a") as f:
            f.write(msg + "\n")


def elapsed() -> float:
    return time.monotonic() - T0


def run_logged(
    cmd: list[str], timeout: float, env: dict | None = None, log_name: str = ""
) -> tuple[int | None, str]:
    """Run a command, keep its output in OUT/<log_name>, return (exit code or None on timeout, tail)."""
    say(f"$ {' '.join(cmd)}   (limit {timeout:.0f} s)")
    try:
        proc = subprocess.run(
            cmd,
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=max(timeout, 1),
            stdin=subprocess.DEVNULL,
        )
        code, text = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout or b""
        code, text = None, (out.decode() if isinstance(out, bytes) else out) + "\n[timed out]"
    if log_name and ARGS:
        (ARGS.out / log_name).write_text(text)
    return code, "\n".join(text.strip().splitlines()[-15:])


# --- what machine is this ---------------------------------------------------------------------------


def nvidia_gpus() -> list[str]:
    """The GPUs nvidia-smi lists ('name, memory, driver'), or [] when there is none or no driver."""
    if not shutil.which("nvidia-smi"):
        return []
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [ln.strip() for ln in out.stdout.splitlines() if ln.strip()] if out.returncode == 0 else []


def table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        lines.append("| " + " | ".join(str(c).replace("|", "/").replace("\n", " ") for c in r) + " |")
    return "\n".join(lines)


# --- CPU machine ---------------------------------------------------------------------------------------


def cpu_checks() -> int:
    py = REPO / ".venv" / "bin" / "python"
    if Path(sys.prefix).resolve() != (REPO / ".venv").resolve():
        if not py.exists():
            say("the course environment is missing; creating it (make venv)")
            code, tail = run_logged(["make", "venv"], timeout=3600, log_name="make-venv.log")
            if code != 0:
                say(tail)
                return 1
        # the checks need the course environment (nbclient, torch, uv): continue in its Python
        os.execve(str(py), [str(py), __file__, *sys.argv[1:]], dict(os.environ, GPU_CHECK_REEXEC="1"))
    say("No NVIDIA GPU is present here (nvidia-smi lists none): GPU mode cannot run on this machine.")
    say(
        "Checking what a CPU machine can: the GPU requirements resolve, and every lab's GPU branch "
        "is reachable.\n"
    )

    sys.path.insert(0, str(REPO))
    from lab_utils.gpu_mode import requirement_pins, resolve_requirements

    rows, ok = [], True
    reqs = REPO / "requirements" / "course-gpu.txt"
    say(f"[{elapsed():4.0f} s] resolving {reqs.relative_to(REPO)} for Linux x86-64, Python 3.11 ...")
    res = resolve_requirements(reqs, timeout=120)
    if res.ok:
        (ARGS.out / "course-gpu.resolved.txt").write_text(
            "".join(f"{n}=={v}\n" for n, v in sorted(res.pins.items()))
        )
        key = ", ".join(
            f"{n} {res.pins[n]}"
            for n in ("vllm", "torch", "transformers", "flashinfer-python", "nvidia-cuda-runtime")
            if n in res.pins
        )
        rows.append(
            [
                "GPU requirements resolve",
                "passed",
                f"{res.tool}, {len(res.pins)} packages in "
                f"{res.seconds:.0f} s: {key} (course-gpu.resolved.txt)",
            ]
        )
        pins = requirement_pins(reqs)
        if res.pins.get("torch") != pins.get("torch") or "+" in res.pins.get("torch", "+"):
            ok = False
            rows.append(
                ["torch is the pinned CUDA build", "FAILED", f"resolved torch {res.pins.get('torch')}"]
            )
    elif res.unreachable:
        rows.append(
            [
                "GPU requirements resolve",
                "not checked",
                f"the registry could not be reached: {res.error.splitlines()[-1] if res.error else ''}",
            ]
        )
    else:
        ok = False
        (ARGS.out / "course-gpu.resolve-error.txt").write_text(res.error)
        rows.append(
            ["GPU requirements resolve", "FAILED", res.error.splitlines()[-1] if res.error else res.tool]
        )

    say(
        f"[{elapsed():4.0f} s] running tests/test_gpu_mode.py (each lab's parameters + setup cell, "
        "BACKEND='gpu', CUDA hidden) ..."
    )
    code, tail = run_logged(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-rs",
            "-p",
            "no:cacheprovider",
            "-m",
            "not slow",
            "tests/test_gpu_mode.py",
            f"--junitxml={ARGS.out / 'test_gpu_mode.xml'}",
        ],
        timeout=300,
        log_name="test_gpu_mode.log",
    )
    passed = re.findall(r"(\d+) passed", tail)
    failed = re.findall(r"(\d+) failed", tail)
    labs = [p.stem[:2] for p in sorted((REPO / "solutions").glob("[0-9][0-9]_*.ipynb"))]
    if code == 0:
        rows.append(
            [
                "every lab's GPU branch is reachable",
                "passed",
                f"labs {', '.join(labs)}: BACKEND='gpu' without CUDA stops in the setup cell with "
                f"resolve_backend's own error ({passed[-1] if passed else '?'} tests)",
            ]
        )
    else:
        ok = False
        rows.append(
            [
                "every lab's GPU branch is reachable",
                "FAILED",
                f"{failed[-1] if failed else '?'} failed; see test_gpu_mode.log",
            ]
        )
        say(tail)
    rows.append(
        [
            "the labs in GPU mode",
            "not run",
            "no GPU on this machine; run `make gpu-check` on an NVIDIA machine",
        ]
    )
    text = table(["check", "result", "detail"], rows)
    finish(text, {"machine": "cpu", "checks": rows, "seconds": round(elapsed(), 1)})
    return 0 if ok else 1


# --- GPU machine ------------------------------------------------------------------------------------


def gpu_run(gpus: list[str]) -> int:
    say("NVIDIA GPU: " + "; ".join(gpus))
    info: dict = {"machine": "gpu", "gpus": gpus, "stages": []}
    budget = ARGS.budget

    def stage(name, status, seconds, detail=""):
        info["stages"].append(
            {"stage": name, "status": status, "seconds": round(seconds, 1), "detail": detail}
        )
        say(f"[{elapsed():4.0f} s] {name}: {status} ({seconds:.0f} s) {detail}")

    # 1. the environment
    if ARGS.python:
        py = Path(ARGS.python)
        stage("install", "skipped", 0, f"--python {py}")
    else:
        venv = REPO / ".venv"
        if (venv / ".installed-cpu").exists() and not (venv / ".installed-gpu").exists():
            venv = REPO / ".venv-gpu"  # never install the GPU packages over the CPU environment
        py = venv / "bin" / "python"
        if ARGS.skip_install:
            stage("install", "skipped", 0, "--skip-install")
        else:
            t = time.monotonic()
            limit = min(INSTALL_LIMIT, budget - elapsed() - 240)
            code, tail = run_logged(
                ["make", "venv", "GPU=1", f"VENV={venv.relative_to(REPO)}", f"PYTHON={ARGS.base_python}"],
                timeout=limit,
                log_name="install.log",
            )
            stage(
                "install requirements/course-gpu.txt",
                "ok" if code == 0 else ("timeout" if code is None else f"failed ({code})"),
                time.monotonic() - t,
                "" if code == 0 else tail.splitlines()[-1] if tail else "",
            )
            if code != 0:
                say(tail)
    if not py.exists():
        return finish_gpu(info, [], "no course environment: the install did not produce " + str(py))

    # 2. what the environment sees
    probe = (
        "import json, torch\nfrom lab_utils.runtime import frameworks, resolve_backend\n"
        "print(json.dumps({'torch': torch.__version__, 'cuda': torch.version.cuda, "
        "'cuda_available': torch.cuda.is_available(), 'auto': resolve_backend('auto'), "
        "'frameworks': {f.name: [f.version, f.note] for f in frameworks()}}))"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO))
    code, tail = run_logged([str(py), "-c", probe], timeout=120, env=env, log_name="environment.log")
    try:
        envinfo = json.loads(tail.splitlines()[-1])
    except (ValueError, IndexError):
        envinfo = {"error": tail}
    info["environment"] = envinfo
    stage(
        "environment",
        "ok" if envinfo.get("auto") == "gpu" else "problem",
        0,
        f"torch {envinfo.get('torch')} CUDA {envinfo.get('cuda')}; BACKEND='auto' picks "
        f"{envinfo.get('auto')}; vllm {envinfo.get('frameworks', {}).get('vllm', ['?'])[0]}",
    )

    # 3. the course model
    t = time.monotonic()
    code, tail = run_logged(
        [str(py), "-m", "lab_utils.models"],
        env=env,
        log_name="model.log",
        timeout=min(MODEL_LIMIT, budget - elapsed() - 120),
    )
    stage(
        "course model",
        "ok" if code == 0 else "failed",
        time.monotonic() - t,
        "" if code == 0 else (tail.splitlines()[-1] if tail else ""),
    )

    # 4. the labs
    wanted = (
        sorted(p.stem[:2] for p in (REPO / "solutions").glob("[0-9][0-9]_*.ipynb"))
        if ARGS.labs == "all"
        else [x.strip().zfill(2) for x in ARGS.labs.split(",") if x.strip()]
    )
    results = []
    for lab in wanted:
        found = sorted((REPO / "solutions").glob(f"{lab}_*.ipynb"))
        if not found:
            results.append({"lab": lab, "status": "no such lab"})
            continue
        left = budget - elapsed() - 20
        limit = min(LAB_LIMITS.get(lab, OTHER_LAB_LIMIT), left)
        if limit < 45:
            results.append({"lab": lab, "status": "not run: the overall time budget was spent"})
            say(f"[{elapsed():4.0f} s] lab {lab}: not run, {left:.0f} s left of the budget")
            continue
        say(
            f"[{elapsed():4.0f} s] lab {lab}: {found[0].name}, BACKEND='gpu', LIGHT=True, limit {limit:.0f} s"
        )
        res_file = ARGS.out / "labs" / f"{lab}.json"
        code, tail = run_logged(
            [
                str(py),
                __file__,
                "--out",
                str(ARGS.out),
                "--grade-lab",
                str(found[0]),
                "--lab-timeout",
                str(limit),
            ],
            timeout=limit + 120,
            env=env,
            log_name=f"lab{lab}.log",
        )
        try:
            results.append(json.loads(res_file.read_text()))
        except (OSError, ValueError):
            results.append(
                {
                    "lab": lab,
                    "status": f"the lab runner failed ({code}): {tail.splitlines()[-1] if tail else ''}",
                }
            )
        say(
            f"          -> {results[-1].get('status')}, {results[-1].get('seconds', '?')} s, "
            f"questions {results[-1].get('passed', '?')}/{results[-1].get('total', '?')}"
        )
    return finish_gpu(info, results)


def _num(x) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def recorded_rows(lab: str, recorded: dict) -> list[dict]:
    """The lab's what-you-measured rows from the results file (lab_utils.results), if it has any."""
    return list((recorded.get(lab) or {}).values())


def key_figures(lab: str, v: dict, recorded: dict) -> dict:
    """kv_tokens / tok_s (best tokens per second) found in a lab's run, with where each came from."""
    out = {}
    rows = recorded_rows(lab, recorded)
    kv = [
        r
        for r in rows
        if re.search(r"kv", r.get("quantity", ""), re.I)
        and "token" in r.get("unit", "")
        and _num(r.get("value")) is not None
    ]
    tps = [
        r
        for r in rows
        if re.search(r"tok\w*\s*/\s*s", r.get("unit", "")) and _num(r.get("value")) is not None
    ]
    if lab == "01" and _num((v.get("vllm_reported") or {}).get("kv_cache_tokens")) is not None:
        out["kv_tokens"] = (v["vllm_reported"]["kv_cache_tokens"], "vllm_reported")
    elif lab == "05" and _num((v.get("MEASURED") or {}).get("KV cache tokens (main server)")) is not None:
        out["kv_tokens"] = (v["MEASURED"]["KV cache tokens (main server)"], "MEASURED")
    elif kv:
        out["kv_tokens"] = (kv[0]["value"], kv[0].get("quantity"))
    if lab == "04" and isinstance(v.get("throughput"), dict) and v["throughput"]:
        out["tok_s"] = (max(float(x) for x in v["throughput"].values()), "throughput")
    elif lab == "05" and (v.get("MEASURED") or {}).get("sweep tok/s"):
        out["tok_s"] = (max(float(x) for x in v["MEASURED"]["sweep tok/s"]), "MEASURED['sweep tok/s']")
    elif tps:
        best = max(tps, key=lambda r: float(r["value"]))
        out["tok_s"] = (float(best["value"]), best.get("quantity"))
    return out


def figures(lab: str, v: dict, recorded: dict) -> str:
    """The figures one lab's run recorded, or a plain statement that it recorded none."""
    parts = []
    k = key_figures(lab, v, recorded)
    if "kv_tokens" in k:
        parts.append(f"vLLM KV capacity {int(k['kv_tokens'][0]):,} tokens")
    if "tok_s" in k:
        who = {"04": "course engine", "05": "vLLM"}.get(lab, "")
        parts.append(f"{who} best {k['tok_s'][0]:.1f} tok/s".strip())
    for r in recorded_rows(lab, recorded):
        value = r.get("value")
        value = f"{value:.4g}" if isinstance(value, float) else value
        parts.append(f"{r.get('quantity')}: {value} {r.get('unit', '')}".strip())
    if not parts:
        wanted = {"01": "vLLM KV capacity", "04": "engine tokens/s", "05": "vLLM KV capacity and tokens/s"}
        return (
            f"not exposed: the notebook recorded no {wanted[lab]}"
            if lab in wanted
            else "no figures recorded (no what-you-measured table)"
        )
    return "; ".join(parts)


def finish_gpu(info: dict, results: list[dict], problem: str = "") -> int:
    recorded = {}
    try:
        sys.path.insert(0, str(REPO))
        from lab_utils.results import load_results

        recorded = load_results(ARGS.out / "results.json")
    except Exception:  # noqa: BLE001 - the summary never fails on a missing results file
        pass
    rows = []
    for r in results:
        v = r.get("variables", {})
        rows.append(
            [
                r["lab"],
                r.get("mode", "—"),
                r.get("seconds", "—"),
                f"{r['passed']}/{r['total']}" if "total" in r else "—",
                r.get("status", "—"),
                figures(r["lab"], v, recorded) if v or recorded else "—",
            ]
        )
    text = ""
    if problem:
        text += f"**{problem}**\n\n"
    text += table(
        ["stage", "status", "s", "detail"],
        [[s["stage"], s["status"], s["seconds"], s["detail"]] for s in info["stages"]],
    )
    text += "\n\n" + table(
        ["lab", "mode detected", "wall s", "questions passed", "status", "key figures"], rows
    )
    by = {r["lab"]: key_figures(r["lab"], r.get("variables", {}), recorded) for r in results}
    eng, vll = by.get("04", {}).get("tok_s"), by.get("05", {}).get("tok_s")
    if eng and vll:
        text += (
            f"\n\nGPU tokens/s: course engine {eng[0]:.0f} (lab 04, from {eng[1]}) vs vLLM {vll[0]:.0f} "
            f"(lab 05, from {vll[1]}): each lab's best over its LIGHT workload, not the same requests; "
            f"ratio {vll[0] / eng[0]:.1f}x."
        )
    else:
        text += (
            "\n\nGPU tokens/s, course engine vs vLLM: not available ("
            + ("lab 04 recorded no engine tokens/s" if not eng else "")
            + ("; " if not eng and not vll else "")
            + ("lab 05 recorded no vLLM tokens/s" if not vll else "")
            + ")."
        )
    info["labs"] = results
    info["seconds"] = round(elapsed(), 1)
    finish(text, info)
    ok = not problem and all(r.get("status") == "ok" and r.get("passed") == r.get("total") for r in results)
    return 0 if ok and results else 1


def finish(text: str, info: dict) -> None:
    say("\n" + text)
    say(f"\ntotal {elapsed():.0f} s; everything is in {ARGS.out}")
    (ARGS.out / "summary.md").write_text(text + "\n")
    (ARGS.out / "summary.json").write_text(json.dumps(info, indent=1, default=str))


# --- one lab, run inside the GPU environment (a subprocess of gpu_run) -----------------------------------

DUMP_CELL = """# added by scripts/gpu_check.py (not part of the lab): keep what this run measured
import json as _json
def _gc_plain(value):
    try:
        return float(value)
    except Exception:
        raise TypeError(type(value).__name__)
_gc_keep = {}
for _gc_name, _gc_value in list(globals().items()):
    if _gc_name.startswith("_") or _gc_name in ("In", "Out", "exit", "quit"):
        continue
    try:
        _gc_text = _json.dumps(_gc_value, default=_gc_plain)
    except Exception:
        continue
    if len(_gc_text) <= 20000:
        _gc_keep[_gc_name] = _json.loads(_gc_text)
with open(%r, "w") as _gc_f:
    _json.dump(_gc_keep, _gc_f)
"""


def grade_lab(path: Path, timeout: float) -> int:
    sys.path.insert(0, str(REPO))
    import nbformat

    lab = path.name[:2]
    labs_dir = ARGS.out / "labs"
    labs_dir.mkdir(parents=True, exist_ok=True)
    dump = labs_dir / f"{lab}.vars.json"
    dump.unlink(missing_ok=True)
    nb = nbformat.read(str(path), as_version=4)
    cell = nbformat.v4.new_code_cell(DUMP_CELL % str(dump))
    cell.metadata["tags"] = ["gpu-check"]
    nb.cells.append(cell)
    sub = ARGS.out / "submissions" / "gpu"
    sub.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(sub / path.name))
    os.environ["LAB_RESULTS_FILE"] = str(ARGS.out / "results.json")
    result = {"lab": lab, "notebook": path.name}
    t = time.monotonic()
    try:
        from grader.grader import Grader, Job

        class _Grader(Grader):
            def _env(self, *a, **kw):  # keep the what-you-measured figures in OUT, not a temp folder
                env = super()._env(*a, **kw)
                env["LAB_RESULTS_FILE"] = str(ARGS.out / "results.json")
                return env

        grader = _Grader(
            ARGS.out / "grader",
            timeout=timeout,
            memory_mb=0,
            seed=0,
            parameters={"BACKEND": ARGS.lab_backend, "LIGHT": True},
        )
        try:
            outcome, feedback = grader.grade(Job("gpu", lab, sub / path.name))
        finally:
            grader.close()
        (labs_dir / f"{lab}.feedback.md").write_text(feedback)
        result.update(
            status=outcome.status,
            passed=sum(1 for q, p in outcome.possible.items() if outcome.scores.get(q, 0) >= p),
            total=len(outcome.possible),
        )
    except Exception as exc:  # noqa: BLE001 - fall back to a plain papermill run, without grading
        result["grader_error"] = f"{type(exc).__name__}: {exc}"
        import papermill

        try:
            papermill.execute_notebook(
                str(sub / path.name),
                str(labs_dir / path.name),
                cwd=str(REPO / "solutions"),
                parameters={"BACKEND": ARGS.lab_backend, "LIGHT": True},
                execution_timeout=int(timeout),
                progress_bar=False,
            )
            result["status"] = "ok (not graded: " + result["grader_error"][:120] + ")"
        except Exception as exc2:  # noqa: BLE001
            result["status"] = (
                f"{type(exc2).__name__}: {str(exc2).splitlines()[0][:200] if str(exc2) else ''}"
            )
    result["seconds"] = round(time.monotonic() - t, 1)
    try:
        variables = json.loads(dump.read_text())
    except (OSError, ValueError):
        variables = {}
    result["variables"] = variables
    result["mode"] = variables.get("MODE", "not recorded (the run stopped before its setup cell finished)")
    (labs_dir / f"{lab}.json").write_text(json.dumps(result, indent=1))
    return 0


ARGS = None


def main(argv=None) -> int:
    global ARGS, LOG
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=REPO / "out" / "gpu-check")
    ap.add_argument("--budget", type=float, default=690, help="overall seconds (default 690: under 12 min)")
    ap.add_argument("--labs", default=",".join(DEFAULT_LABS), help="lab numbers, or 'all'")
    ap.add_argument("--python", help="use this interpreter's environment instead of installing one")
    ap.add_argument("--skip-install", action="store_true", help="use the existing GPU environment as it is")
    ap.add_argument(
        "--base-python",
        default=os.environ.get("PYTHON", "python3"),
        help="the Python that creates the environment (default python3)",
    )
    ap.add_argument("--grade-lab", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--lab-timeout", type=float, default=300, help=argparse.SUPPRESS)
    ap.add_argument("--lab-backend", default="gpu", help=argparse.SUPPRESS)  # "cpu": try the runner here
    ARGS = ap.parse_args(argv)
    ARGS.out = ARGS.out.resolve()
    ARGS.out.mkdir(parents=True, exist_ok=True)
    if ARGS.grade_lab:
        return grade_lab(ARGS.grade_lab.resolve(), ARGS.lab_timeout)
    LOG = ARGS.out / "log.txt"
    if not os.environ.get("GPU_CHECK_REEXEC"):
        LOG.write_text("")
    gpus = nvidia_gpus()
    return gpu_run(gpus) if gpus else cpu_checks()


if __name__ == "__main__":
    sys.exit(main())
