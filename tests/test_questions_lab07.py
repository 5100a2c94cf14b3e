"""Lab 07's graded questions: right answers pass under any seed, the known bypasses score zero.

No server here: the measured question is an analysis of two /stats answers, graded on snapshots the
hidden check makes up; the prediction is a function of the scenario, graded on unseen scenarios.
"""

from __future__ import annotations

import pytest

from grader.judge import score_graded
from grader.memorise import memorised_answers
from lab_utils.grading import get, questions_for, score
from lab_utils.triton.config import config_from_dict

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


def trtllm_kv_tokens(model_yaml, gpu, weights, act, kv):
    import yaml

    args = yaml.safe_load(model_yaml)
    cfg = args.get("kv_cache_config") or {}
    gpus = int(args.get("tensor_parallel_size", 1))
    per_token = kv / gpus / (2 if cfg.get("dtype") == "fp8" else 1)
    budget = max(gpu - weights / gpus - act, 0) * 2**30 * cfg.get("free_gpu_memory_fraction", 0.9)
    if cfg.get("max_gpu_total_bytes", 0) > 0:
        budget = min(budget, cfg["max_gpu_total_bytes"])
    tokens = int(budget // per_token)
    return tokens if cfg.get("max_tokens") is None else min(tokens, int(cfg["max_tokens"]))


def old_trtllm_kv_tokens(model_yaml, gpu, weights, act, kv):
    """The engine-era rule: the fraction and max_tokens only, one GPU, no defaults or dtype."""
    import yaml

    cfg = (yaml.safe_load(model_yaml) or {}).get("kv_cache_config") or {}
    tokens = int((gpu - weights - act) * 2**30 * cfg.get("free_gpu_memory_fraction", 0.9) // kv)
    return tokens if cfg.get("max_tokens") is None else min(tokens, int(cfg["max_tokens"]))


def predicted_avg_batch(scenario):
    return min(scenario["concurrency"], scenario["preferred_batch_size"])


def average_batch(before, after, model):
    def totals(stats):
        inf = ex = 0
        for entry in stats["model_stats"]:
            if entry["name"] == model:
                inf, ex = inf + int(entry["inference_count"]), ex + int(entry["execution_count"])
        return inf, ex

    (i0, e0), (i1, e1) = totals(before), totals(after)
    return (i1 - i0) / (e1 - e0)


def _stats(inferences, executions, sizes, name="mlp"):
    return {
        "model_stats": [
            {
                "name": name,
                "version": "1",
                "inference_count": inferences,
                "execution_count": executions,
                "batch_stats": [
                    {"batch_size": b, "compute_infer": {"count": n, "ns": 1000 * n}} for b, n in sizes.items()
                ],
            }
        ]
    }


def answers(seed=None):
    return {
        "batching_config": batching_config,
        "served_versions": served_versions,
        "ensemble_config": ensemble_config,
        "extra_tensor_bytes": extra_tensor_bytes,
        "pending_requests": pending_requests,
        "trtllm_kv_tokens": trtllm_kv_tokens,
        "predicted_avg_batch": predicted_avg_batch,
        "average_batch": average_batch,
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


def test_the_library_statistics_reader_scores_zero():
    from lab_utils.triton.measure import BatchCounts, batch_counts

    a = answers()
    a["average_batch"] = lambda before, after, model: (
        batch_counts(after, model) - batch_counts(before, model)
    ).average_batch
    assert score_graded(get("07.batching_measured"), a, 3).earned == 0
    a["average_batch"] = lambda before, after, model: BatchCounts(1, 1, {}).average_batch
    assert score_graded(get("07.batching_measured"), a, 3).earned == 0


def test_the_analysis_reads_every_version_and_only_the_model_asked():
    a = answers()
    # the first entry only: wrong when the model has two versions or another model comes first
    a["average_batch"] = lambda before, after, model: (
        (after["model_stats"][0]["inference_count"] - before["model_stats"][0]["inference_count"])
        / (after["model_stats"][0]["execution_count"] - before["model_stats"][0]["execution_count"])
    )
    assert score_graded(get("07.batching_measured"), a, 3).earned == 0
    a = answers()
    a["average_batch"] = lambda before, after, model: average_batch({"model_stats": []}, after, model)
    assert score_graded(get("07.batching_measured"), a, 3).earned == 0  # the snapshot before counts


def test_the_analysis_applied_to_the_labs_measurement():
    """The notebook applies average_batch to two raw /stats answers, as Triton returns them."""
    before, after = _stats(2, 2, {1: 2}), _stats(2 + 8 * 3, 2 + 8, {1: 2, 3: 8})
    assert average_batch(before, after, "mlp") == 3.0


def test_a_prediction_that_ignores_the_load_scores_zero():
    a = answers()
    a["predicted_avg_batch"] = lambda s: s["preferred_batch_size"]
    assert score_graded(get("07.predicted_batch"), a, 3).earned == 0
    a["predicted_avg_batch"] = lambda s: min(s["concurrency"], 16)
    assert score_graded(get("07.predicted_batch"), a, 3).earned == 0


def test_bypass_submissions_score_at_most_a_tenth():
    from grader.memorise import copied_prediction_answers, imported_answers

    total = sum(q.points for q in questions_for("07"))
    for build in (memorised_answers, imported_answers, copied_prediction_answers):
        fake = build("07", answers())
        assert sum(score_graded(q, fake, 99).earned for q in questions_for("07")) <= 0.1 * total, (
            build.__name__
        )


def test_memorised_submission_scores_at_most_a_quarter():
    fake = memorised_answers("07", answers(3))
    total = sum(score_graded(q, fake, 99).earned for q in questions_for("07"))
    assert total <= 0.25 * sum(q.points for q in questions_for("07")), total


def test_stubs_fail_the_public_checks():
    def stub(*a, **k):
        raise NotImplementedError

    for q in questions_for("07"):
        assert score(q, {n: stub for n in q.answers}).earned == 0


def test_kv_tokens_needs_the_whole_llmapi_rule():
    """Only the fraction and max_tokens of one GPU (the engine backend's rule) does not pass."""
    q = get("07.trtllm_kv_tokens")
    assert score_graded(q, {**answers(), "trtllm_kv_tokens": old_trtllm_kv_tokens}, 5).earned < q.points / 2
    assert score_graded(q, answers(), 5).earned == q.points


def test_kv_tokens_planner_is_forbidden():
    from lab_utils.trtllm.plan import concurrent_sequences

    def via_planner(model_yaml, gpu, weights, act, kv):
        return concurrent_sequences(int(gpu * 2**30), int(weights * 2**30), int(act * 2**30), 0.9, kv, 1, 1)

    q = get("07.trtllm_kv_tokens")
    assert score_graded(q, {**answers(), "trtllm_kv_tokens": via_planner}, 5).earned == 0
