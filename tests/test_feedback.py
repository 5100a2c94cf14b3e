"""Feedback that teaches (issue 38 item 10): a "partly right" says which property failed, never a
value; a refusal names what was called as what it is."""

from __future__ import annotations

import pytest

from grader.judge import refused
from grader.library import HIDDEN_LABEL
from lab_utils.grading.checks import partial
from lab_utils.grading.registry import Question
from lab_utils.grading.scoring import PARTIAL, check_fraction, result_for


def test_a_partly_right_answer_is_told_the_property_that_failed():
    frac = partial(
        3, 4, "token sequences", "text that may still become a stop string waits for the next token"
    )
    value, status, message = check_fraction(frac)
    assert value == 0.75 and status == ""
    r = result_for(Question("00.x", 2.0, ("a",), fn=None), value, message)
    assert r.status == PARTIAL and r.earned == 1.5
    assert (
        r.message
        == "right on 3 of 4 unseen token sequences: text that may still become a stop string waits for the next token"
    )
    with pytest.raises(AssertionError, match="wrong on all 4 unseen token sequences: the rule"):
        partial(0, 4, "token sequences", "the rule")
    assert partial(4, 4, "token sequences", "the rule") is None


def test_refusals_name_what_was_called_and_never_a_hidden_reference():
    assert refused("statistics:median").startswith(
        "`statistics.median` is not allowed here: the question asks"
    )
    assert refused("numpy:percentile").startswith("`numpy.percentile` is not allowed here")
    assert refused("lab_utils.sim.scheduler:reference_schedule").startswith(
        "the course's `reference_schedule`"
    )
    hidden = refused(HIDDEN_LABEL)
    assert "grader's own reference" in hidden and "_ref" not in hidden
