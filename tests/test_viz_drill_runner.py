"""The drill runner without a front end: the static rendering, the score per topic, the plot; and
the widget's handlers driven by clicking its buttons in code."""

from __future__ import annotations

import builtins

import matplotlib

matplotlib.use("Agg")

import pytest

from lab_utils.drills import make_drills
from lab_utils.viz.drill_runner import DrillSession, render_static, run_drills


@pytest.fixture(autouse=True)
def no_input(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the drill runner must never call input()")

    monkeypatch.setattr(builtins, "input", refuse)


def test_static_rendering_lists_questions_without_answers():
    drills = make_drills(5, n=4)
    text = run_drills(DrillSession(drills), interactive=False)
    for d in drills:
        assert d.question in text
    assert "Worked answer" not in text


def test_static_rendering_scores_answers_per_topic():
    drills = make_drills(5, topics=["speculative", "cost"], n=4)
    answers = [d.answer if i % 2 == 0 else d.answer * 2 for i, d in enumerate(drills)]
    session = DrillSession(drills)
    text = render_static(session, answers, seconds=[10, 20, 30, 40])
    assert text.count("Worked answer") == 4 and "not within tolerance" in text
    scores = session.by_topic()
    assert sum(v["right"] for v in scores.values()) == 2
    assert sum(v["answered"] for v in scores.values()) == 4
    assert "total" in session.score_text() and session.current is None
    fig = session.plot()
    assert len(fig.axes) == 2
    with pytest.raises(IndexError):
        session.answer(1.0, 1.0)


def test_unparseable_answer_is_wrong_not_an_error():
    session = DrillSession(make_drills(1, n=1))
    assert "no answer" in session.answer("twelve", 3.0)
    assert not session.attempts[0].correct


def test_widget_handlers():
    widgets = pytest.importorskip("ipywidgets")
    from lab_utils.viz.drill_runner import drill_widget

    drills = make_drills(2, n=2)
    session = DrillSession(drills)
    ui = drill_widget(session)
    row = ui.children[1]
    box, submit, nxt = row.children[0], row.children[2], row.children[3]
    assert isinstance(box, widgets.FloatText) and drills[0].question in ui.children[0].value
    box.value = drills[0].answer
    submit.click()
    assert session.attempts[0].correct and not nxt.disabled
    nxt.click()
    assert drills[1].question in ui.children[0].value
    box.value = -1.0
    submit.click()
    nxt.click()
    assert "Done" in ui.children[0].value and submit.disabled
