"""Timed drill practice: an ipywidgets runner, and a static rendering when widgets are unavailable.

    session = DrillSession(make_drills(seed=4, n=12))
    run_drills(session)                 # in JupyterLab: question, answer box, timer, feedback, scores
    run_drills(session, interactive=False, answers=[...])   # papermill / scripts: plain text

`DrillSession` keeps the score (per topic: answered, right, seconds) and draws the accuracy and
time plot; both front ends use it, so the headless path tests the same bookkeeping. ipywidgets is
imported only inside the widget function; nothing here calls input().
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass
class Attempt:
    """One answered drill."""

    drill_id: str
    topic: str
    given: float | None
    correct: bool
    seconds: float


@dataclass
class DrillSession:
    """A sequence of drills and the learner's attempts at them."""

    drills: list
    attempts: list[Attempt] = field(default_factory=list)
    position: int = 0  # index of the drill being shown

    @property
    def current(self):
        """The drill to answer next, or None when the set is done."""
        return self.drills[self.position] if self.position < len(self.drills) else None

    def answer(self, value, seconds: float) -> str:
        """Record an answer to the current drill, move on, and return the feedback text."""
        drill = self.current
        if drill is None:
            raise IndexError("every drill in this session has been answered")
        try:
            given = float(value)
        except (TypeError, ValueError):
            given = None
        ok = drill.is_correct(given)
        self.attempts.append(Attempt(drill.id, drill.topic, given, ok, float(seconds)))
        self.position += 1
        verdict = "right" if ok else "not within tolerance"
        shown = "no answer" if given is None else f"{given:.4g}"
        return (
            f"{verdict}: you said {shown} {drill.unit}; reference {drill.answer:.4g} {drill.unit} "
            f"(tolerance {drill.tolerance:.1%}), {seconds:.0f} s.\nWorked answer: {drill.explanation}"
        )

    def by_topic(self) -> dict[str, dict]:
        """Per topic: answered, right, accuracy and mean seconds."""
        out: dict[str, dict] = {}
        for a in self.attempts:
            t = out.setdefault(a.topic, {"answered": 0, "right": 0, "seconds": 0.0})
            t["answered"] += 1
            t["right"] += int(a.correct)
            t["seconds"] += a.seconds
        for t in out.values():
            t["accuracy"] = t["right"] / t["answered"]
            t["mean_seconds"] = t["seconds"] / t["answered"]
        return out

    def score_text(self) -> str:
        """The running score as a small text table."""
        rows = self.by_topic()
        if not rows:
            return "no drills answered yet"
        lines = [f"{'topic':<14}{'right':>7}{'mean s':>8}"]
        lines += [
            f"{k:<14}{v['right']:>3}/{v['answered']:<3}{v['mean_seconds']:>8.0f}"
            for k, v in sorted(rows.items())
        ]
        right = sum(a.correct for a in self.attempts)
        lines.append(f"{'total':<14}{right:>3}/{len(self.attempts):<3}")
        return "\n".join(lines)

    def plot(self):
        """A Figure: accuracy (bars) and mean time (bars) per topic.

        Built without pyplot, so no backend keeps it open or draws it a second time: callers
        display it (or `png()` it) and drop it."""
        from matplotlib.figure import Figure

        rows = sorted(self.by_topic().items())
        fig = Figure(figsize=(10, 3.2))
        ax1, ax2 = fig.subplots(1, 2)
        names = [k for k, _ in rows] or ["(none)"]
        ax1.barh(names, [v["accuracy"] for _, v in rows] or [0], color="tab:green")
        ax1.set_xlim(0, 1)
        ax1.set_xlabel("accuracy")
        ax2.barh(names, [v["mean_seconds"] for _, v in rows] or [0], color="tab:blue")
        ax2.set_xlabel("mean seconds per drill")
        ax2.set_yticklabels([])
        fig.tight_layout()
        return fig

    def png(self) -> bytes:
        """The score plot rendered once to PNG bytes (what the widget shows)."""
        import io

        buf = io.BytesIO()
        self.plot().savefig(buf, format="png", dpi=100, bbox_inches="tight")
        return buf.getvalue()


def _widget_front_end() -> bool:
    try:
        import ipywidgets  # noqa: F401
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def drill_widget(session: DrillSession, time_limit_s: float | None = None):
    """The interactive runner: question, answer box, running timer, feedback, score and plot."""
    import threading

    import ipywidgets as widgets
    from IPython.display import Image, display

    question = widgets.HTML()
    box = widgets.FloatText(description="answer")
    unit = widgets.Label()
    submit, nxt = (
        widgets.Button(description="Check", button_style="primary"),
        widgets.Button(description="Next"),
    )
    timer = widgets.Label()
    feedback, scores = widgets.Output(), widgets.Output()
    state = {"start": time.monotonic(), "open": True}
    stop = threading.Event()

    def tick() -> None:  # the timer label counts while a question is open
        while not stop.wait(1.0):
            if state["open"]:
                left = "" if time_limit_s is None else f" / {time_limit_s:.0f}"
                timer.value = f"{time.monotonic() - state['start']:.0f}{left} s"

    def show(_=None) -> None:
        drill = session.current
        feedback.clear_output()
        if drill is None:
            question.value = "<b>Done.</b> Your score by topic is below."
            submit.disabled = nxt.disabled = True
            stop.set()
            return
        question.value = (
            f"<b>{drill.topic}</b> ({session.position + 1}/{len(session.drills)}): {drill.question}"
        )
        unit.value = drill.unit
        state.update(start=time.monotonic(), open=True)
        submit.disabled, nxt.disabled = False, True

    def check(_=None) -> None:
        state["open"] = False
        text = session.answer(box.value, time.monotonic() - state["start"])
        submit.disabled, nxt.disabled = True, False
        with feedback:
            print(text)
        scores.clear_output(wait=True)
        png = session.png()  # drawn in full before anything is shown
        with scores:
            print(session.score_text())
            display(Image(data=png, format="png"))

    submit.on_click(check)
    nxt.on_click(show)
    show()
    threading.Thread(target=tick, daemon=True).start()
    return widgets.VBox([question, widgets.HBox([box, unit, submit, nxt, timer]), feedback, scores])


def render_static(
    session: DrillSession, answers: Sequence | None = None, seconds: Sequence | None = None
) -> str:
    """Plain text: every question; with `answers`, also the feedback, the score and the plot."""
    parts = []
    for i, drill in enumerate(session.drills):
        parts.append(f"[{i + 1}] {drill.topic}: {drill.question}  ({drill.unit})")
        if answers is not None and i < len(answers):
            took = float(seconds[i]) if seconds is not None and i < len(seconds) else 0.0
            parts.append("    " + session.answer(answers[i], took).replace("\n", "\n    "))
    if answers is not None:
        parts.append(session.score_text())
    return "\n".join(parts)


def run_drills(
    session: DrillSession,
    interactive: bool | None = None,
    answers: Sequence | None = None,
    seconds: Sequence | None = None,
    time_limit_s: float | None = None,
):
    """The widget runner when a widget front end is there, else the static text (and plot when answered).

    `interactive=None` guesses (ipywidgets importable and a kernel running); pass False under
    papermill or in a script. Returns the widget, or the text.
    """
    if interactive is None:
        interactive = _widget_front_end()
    if interactive:
        from IPython.display import display

        ui = drill_widget(session, time_limit_s)
        display(ui)
        return ui
    text = render_static(session, answers, seconds)
    print(text)
    if answers is not None and session.attempts:
        try:
            from IPython import get_ipython
            from IPython.display import display

            if get_ipython() is not None:
                display(session.plot())
        except ImportError:
            pass
    return text
