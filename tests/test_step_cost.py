"""lab_utils.engine.step_cost: the per-step costs lab 05's speculation forecast starts from."""

from __future__ import annotations

import pytest

from lab_utils.engine.step_cost import step_costs


def test_a_step_checks_at_least_one_draft():
    with pytest.raises(ValueError, match="at least 1"):
        step_costs("unused", "unused", k=0)


@pytest.mark.slow
def test_a_model_drafting_for_itself_costs_one_target_step():
    from lab_utils.models import course_model_path

    model = course_model_path()
    # the same model twice: a draft step is a target step, up to this machine's noise. make test runs
    # another pytest process beside this one (scripts/test_streams.py), so one measurement may land on
    # a busy moment (2026-12-06: draft 66 ms against target 149 ms): up to three measurements, one in range
    tries = []
    for _ in range(3):
        costs = step_costs(model, model, k=3, context=32, reps=5)
        tries.append(round(costs["draft_cost"], 3))
        if 0.5 < costs["draft_cost"] < 2.0:
            break
    assert 0.5 < costs["draft_cost"] < 2.0, (tries, costs)
    # checking 3 drafts runs 4 tokens through the target: never cheaper than about one token
    assert costs["verify_ms"] > 0.5 * costs["target_ms"], costs
    assert costs["verify_cost_per_draft"] >= 0.0
