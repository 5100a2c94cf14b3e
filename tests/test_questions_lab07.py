"""Lab 07's graded questions: right answers pass under any seed, the known bypasses score zero.

No server here: the measured question gets a statistics object built the way the lab's measuring
code builds it (`batch_counts` on a /stats answer, then a difference), which stamps it.
"""

from __future__ import annotations

import pytest

from grader.judge import score_graded
from grader.memorise import memorised_answers
from lab_utils.grading import get, lab_scenario, questions_for, score
from lab_utils.triton.config import config_from_dict
from lab_utils.triton.measure import batch_counts

MLP = """
name: "mlp"
backend: "python"
max_batch_size: 16
input [ { name: "x", data_type: TYPE_FP32, dims: [ 16 ] } ]
output [ { name: "y", data_type: TYPE_FP32, dims: [ 16 ] } ]
"""


def batching_config(preferred, delay_us):
    sizes = ", ".join(str(int(b)) for b in preferred)
    return (
        MLP
        + f"dynamic_batching {{ preferred_batch_size: [ {sizes} ] max_queue_delay_microseconds: {int(delay_us)} }}"
    )


def served_versions(on_disk, policy):
    versions = sorted(int(v) for v in on_disk)
    if "all" in policy:
        return versions
    if "specific" in policy:
        return [v for v in versions if v in set(policy["specific"]["versions"])]
    return versions[-int(policy.get("latest", {}).get("num_versions", 1)) :]


def ensemble_config(name, models):
    produced, inputs, steps = set(), {}, []
    for m in models:
        for t, d in m["inputs"].items():
            if t not in produced:
                inputs.setdefault(t, d)
        steps.append(
            {
                "model_name": m["name"],
                "model_version": -1,
                "input_map": {t: t for t in m["inputs"]},
                "output_map": {t: t for t in m["outputs"]},
            }
        )
        produced.update(m["outputs"])
    return config_from_dict(
        {
            "name": name,
            "platform": "ensemble",
            "max_batch_size": 0,
            "input": [{"name": t, "data_type": d, "dims": [-1]} for t, d in inputs.items()],
            "output": [{"name": t, "data_type": d, "dims": [-1]} for t, d in models[-1]["outputs"].items()],
            "ensemble_scheduling": {"step": steps},
        }
    )


def extra_tensor_bytes(p, n, b=8):
    return 2 * b * (p + n)


def pending_requests(text, model):
    import re

    total = 0.0
    for line in text.splitlines():
        m = re.match(r"^nv_inference_pending_request_count\{([^}]*)\}\s+(\S+)", line)
        if m and re.search(r'(^|,)model="' + re.escape(model) + '"', m.group(1)):
            total += float(m.group(2))
    return total


def trtllm_kv_tokens(gpu, weights, act, fraction, kv, max_tokens=None):
    tokens = int((gpu - weights - act) * 2**30 * fraction // kv)
    return tokens if max_tokens is None else min(tokens, int(max_tokens))


def _stats(inferences, executions, sizes):
    return {
        "model_stats": [
            {
                "name": "mlp",
                "version": "1",
                "inference_count": inferences,
                "execution_count": executions,
                "batch_stats": [
                    {"batch_size": b, "compute_infer": {"count": n, "ns": 1000 * n}} for b, n in sizes.items()
                ],
            }
        ]
    }


def measured(scenario):
    """What `measure` returns under SCENARIO's load: a stamped difference of two snapshots."""
    c, p = scenario["concurrency"], scenario["preferred_batch_size"]
    size = min(c, p)
    before = batch_counts(_stats(2, 2, {1: 2}), "mlp")
    after = batch_counts(_stats(2 + 8 * size, 2 + 8, {1: 2, size: 8}), "mlp")
    return after - before


def answers(seed):
    s = lab_scenario("07", seed)
    counts = measured(s)
    return {
        "batching_config": batching_config,
        "served_versions": served_versions,
        "ensemble_config": ensemble_config,
        "extra_tensor_bytes": extra_tensor_bytes,
        "pending_requests": pending_requests,
        "trtllm_kv_tokens": trtllm_kv_tokens,
        "predicted_avg_batch": min(s["concurrency"], s["preferred_batch_size"]),
        "BATCHING_RESULT": counts,
        "measured_avg_batch": counts.inference_count / counts.execution_count,
    }


@pytest.mark.parametrize("seed", [3, 1234567])
def test_right_answers_score_full_marks_under_any_seed(seed):
    a = answers(seed)
    for q in questions_for("07"):
        r = score_graded(q, a, seed)
        assert r.earned == q.points, r


def test_the_references_in_lab_utils_score_zero():
    from lab_utils.triton import recipes

    a = answers(3)
    a["ensemble_config"] = recipes.ensemble_config
    a["batching_config"] = lambda preferred, delay: config_from_dict(
        recipes.mlp_config(
            dynamic_batching={"preferred_batch_size": preferred, "max_queue_delay_microseconds": delay}
        )
    )
    for qid in ("07.ensemble_config", "07.batching_config"):
        r = score_graded(get(qid), a, 3)
        assert r.earned == 0, r


def test_a_hand_written_measurement_scores_zero():
    a = answers(3)
    c = a["BATCHING_RESULT"]
    a["BATCHING_RESULT"] = {
        "inferences": c.inference_count,
        "executions": c.execution_count,
        "histogram": dict(c.batch_sizes),
    }
    assert score_graded(get("07.batching_measured"), a, 3).earned == 0
    from lab_utils.triton.measure import BatchCounts

    a["BATCHING_RESULT"] = BatchCounts(c.inference_count, c.execution_count, dict(c.batch_sizes))
    assert score_graded(get("07.batching_measured"), a, 3).earned == 0


def test_a_prediction_typed_in_from_another_scenario_fails():
    a, seed = answers(3), None
    for s in range(4, 200):
        sc = lab_scenario("07", s)
        if min(sc["concurrency"], sc["preferred_batch_size"]) != a["predicted_avg_batch"]:
            seed = s
            break
    assert score_graded(get("07.predicted_batch"), a, seed).earned == 0


def test_memorised_submission_scores_at_most_a_quarter():
    fake = memorised_answers("07", answers(3))
    total = sum(score_graded(q, fake, 99).earned for q in questions_for("07"))
    assert total <= 0.25 * sum(q.points for q in questions_for("07")), total


def test_stubs_fail_the_public_checks():
    def stub(*a, **k):
        raise NotImplementedError

    for q in questions_for("07"):
        assert score(q, {n: stub for n in q.answers}).earned == 0
