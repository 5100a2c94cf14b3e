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
    costs = step_costs(model, model, k=3, context=32, reps=5)
    # the same model twice: a draft step is a target step, up to this machine's noise
    assert 0.5 < costs["draft_cost"] < 2.0, costs
    # checking 3 drafts runs 4 tokens through the target: never cheaper than about one token
    assert costs["verify_ms"] > 0.5 * costs["target_ms"], costs
    assert costs["verify_cost_per_draft"] >= 0.0
