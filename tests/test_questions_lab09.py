"""Lab 09's graded questions, without running the notebook.

Solution-like answers (written here, not imported from lab_utils) must earn full marks under two
seeds; plausible mistakes, numpy's percentile, a wrapper around the course's helper and lookup
tables must not.
"""

from __future__ import annotations

import math

import pytest
from submissions import judge_in_sandbox, notebook_namespace
from test_clients import fake_server  # noqa: F401  (the fixture)

from grader.judge import score_graded
from lab_utils.grading import questions_for

SEEDS = (3, 11)


def percentiles(values, qs):
    xs = sorted(float(v) for v in values)
    out = []
    for q in qs:
        pos = (len(xs) - 1) * q / 100
        lo = int(pos)
        hi = min(lo + 1, len(xs) - 1)
        out.append(xs[lo] + (xs[hi] - xs[lo]) * (pos - lo))
    return out


def goodput(records, ttft_slo, tpot_slo, duration_s):
    good = sum(
        1
        for r in records
        if r["ok"]
        and r["ttft"] is not None
        and r["ttft"] <= ttft_slo
        and (r["tpot"] is None or r["tpot"] <= tpot_slo)
    )
    return good / duration_s


def knee_rate(fixed_s, per_token_s, input_tokens, output_tokens, max_seqs):
    # tokens per step: max_seqs requests, each averaging (prompt + later tokens) / output_tokens per step
    step = fixed_s + per_token_s * max_seqs * (input_tokens + output_tokens - 1) / output_tokens
    return max_seqs / (output_tokens * step)


def hidden_latency(records, q):
    done = [r for r in records if r["error"] is None and r["finish"] is not None]
    a = percentiles([r["finish"] - r["due"] for r in done], [q])[0]
    b = percentiles([r["finish"] - r["sent"] for r in done], [q])[0]
    return a - b


def little_L(records, t0, t1):
    total = 0.0
    for r in records:
        end = t1 if r["finish"] is None else min(t1, r["finish"])
        total += max(0.0, end - max(t0, r["start"]))
    return total / (t1 - t0)


def my_policy(obs):
    cap = obs["capacity_rps"]
    want = math.ceil(obs["rps"] / (0.7 * cap) + obs["queue"] / (cap * obs["interval_s"]))
    return max(1, want + (obs["ttft_p95"] > obs["ttft_slo_s"]))


def cost_per_mtok(replicas, interval_s, price_per_hour, output_tokens):
    return sum(replicas) * interval_s / 3600 * price_per_hour / (output_tokens / 1e6)


ANSWERS = {
    "percentiles": percentiles,
    "goodput": goodput,
    "knee_rate": knee_rate,
    "hidden_latency": hidden_latency,
    "little_L": little_L,
    "my_policy": my_policy,
    "cost_per_mtok": cost_per_mtok,
}
QS = {q.id: q for q in questions_for("09")}


@pytest.mark.parametrize("seed", SEEDS)
def test_solution_like_answers_score_full(seed):
    for qid, q in QS.items():
        if qid == "09.scaling_policy":
            continue  # simulated hours of traffic: the notebook run proves it
        r = score_graded(q, dict(ANSWERS), seed)
        assert r.earned == r.points, f"{qid}: {r.status} {r.message}"


def test_every_answer_is_a_function():
    for q in QS.values():
        for name in q.answers:
            assert callable(ANSWERS[name]), name


def _zero(qid, **answers):
    return score_graded(QS[qid], {**ANSWERS, **answers}, SEEDS[0]).earned == 0


def test_numpy_and_course_percentiles_score_zero():
    np = pytest.importorskip("numpy")
    from lab_utils.clients.loadgen import percentile

    assert _zero("09.percentiles", percentiles=lambda v, qs: [float(np.percentile(v, q)) for q in qs])
    assert _zero(
        "09.percentiles", percentiles=lambda v, qs: [float(x) for x in np.quantile(v, [q / 100 for q in qs])]
    )
    assert _zero("09.percentiles", percentiles=lambda v, qs: [percentile(v, q) for q in qs])

    def np_hidden(records, q):
        done = [r for r in records if r["error"] is None and r["finish"] is not None]
        return float(np.percentile([r["finish"] - r["due"] for r in done], q)) - float(
            np.percentile([r["finish"] - r["sent"] for r in done], q)
        )

    assert _zero("09.coordinated_omission", hidden_latency=np_hidden)


def test_plausible_mistakes_score_zero():
    # the old model: prefill ignored
    assert _zero("09.knee_rate", knee_rate=lambda f, c, p, n, b: b / (n * (f + c * b)))
    # prompt counted, but as if the first token still needed its own decode step
    assert _zero("09.knee_rate", knee_rate=lambda f, c, p, n, b: 1 / (n * f / b + c * (p + n)))

    def all_requests(records, q):  # failed requests counted too
        for r in records:
            r["finish"] = r["finish"] if r["finish"] is not None else r["sent"]
        return (
            percentiles([r["finish"] - r["due"] for r in records], [q])[0]
            - percentiles([r["finish"] - r["sent"] for r in records], [q])[0]
        )

    assert _zero("09.coordinated_omission", hidden_latency=all_requests)

    def mean_gap(records, q):  # the mean send lag, not what the percentile hides
        done = [r for r in records if r["error"] is None and r["finish"] is not None]
        return sum(r["sent"] - r["due"] for r in done) / len(done)

    assert _zero("09.coordinated_omission", hidden_latency=mean_gap)

    def unclipped(records, t0, t1):  # whole stays, not the part inside the window
        done = [r for r in records if r["finish"] is not None]
        return sum(r["finish"] - r["start"] for r in done) / (t1 - t0)

    assert _zero("09.littles_law", little_L=unclipped)


def test_library_helpers_that_do_the_work_score_zero():
    """goodput from the SLO objects' own verdicts: the question forbids the helper that would answer it."""
    from lab_utils.bench.load import SLO

    def slo_met(records, ttft_slo, tpot_slo, duration_s):
        return sum(SLO(ttft_slo, tpot_slo).met(r["ttft"], r["tpot"], r["ok"]) for r in records) / duration_s

    assert _zero("09.goodput", goodput=slo_met)

    # the drills' goodput and cost calculators are the grader's since issue 47 (grader/drill_calc.py):
    # nothing in the learner's copy to call


@pytest.mark.parametrize("seed", SEEDS)
def test_scaling_policy_solution_full_and_a_fixed_fleet_at_most_a_third(seed):
    """Hidden traces at half, the same and twice the scenario's traffic: a policy that sizes the fleet
    from the load meets the bounds on all three, a fixed fleet on one at most, and the lab's own
    reference policies are references."""
    from lab_utils.bench.autoscale import queue_policy

    q = QS["09.scaling_policy"]
    r = score_graded(q, dict(ANSWERS), seed)
    assert r.earned == r.points, r.message
    for n in (2, 4, 8, 16):
        fixed = score_graded(q, {**ANSWERS, "my_policy": lambda obs, n=n: n}, seed)
        assert fixed.earned <= q.points / 3 + 1e-9, (n, fixed.earned)
    assert score_graded(q, {**ANSWERS, "my_policy": queue_policy}, seed).earned == 0


def test_lookup_tables_of_the_public_cases_score_zero():
    from grader.memorise import memorised_answers

    fake = memorised_answers("09", dict(ANSWERS))
    for qid in ("09.percentiles", "09.knee_rate", "09.coordinated_omission", "09.littles_law"):
        assert score_graded(QS[qid], {**ANSWERS, **fake}, SEEDS[1]).earned == 0, qid


_NUMPY_ANSWERS = """
import numpy as np


def percentiles(values, qs):
    return [float(np.percentile(values, q)) for q in qs]


def hidden_latency(records, q):
    done = [r for r in records if r["error"] is None and r["finish"] is not None]
    return float(np.percentile([r["finish"] - r["due"] for r in done], q)) - float(
        np.percentile([r["finish"] - r["sent"] for r in done], q)
    )


def little_L(records, t0, t1):
    total = 0.0
    for r in records:
        end = t1 if r["finish"] is None else min(t1, r["finish"])
        total += max(0.0, end - max(t0, r["start"]))
    return total / (t1 - t0)
"""


_OTHER_QUANTILES = """
import numpy.lib._function_base_impl as impl
import torch


def percentiles(values, qs):
    return [float(impl.percentile(values, q)) for q in qs]


def hidden_latency(records, q):
    done = [r for r in records if r["error"] is None and r["finish"] is not None]
    due = torch.tensor([r["finish"] - r["due"] for r in done], dtype=torch.float64)
    sent = torch.tensor([r["finish"] - r["sent"] for r in done], dtype=torch.float64)
    return float(torch.quantile(due, q / 100)) - float(sent.quantile(q / 100))


def little_L(records, t0, t1):
    total = 0.0
    for r in records:
        end = t1 if r["finish"] is None else min(t1, r["finish"])
        total += max(0.0, end - max(t0, r["start"]))
    return total / (t1 - t0)
"""


@pytest.mark.slow
@pytest.mark.parametrize("source", [_OTHER_QUANTILES], ids=["numpy-impl-module-and-torch"])
def test_other_quantiles_are_refused_inside_the_sandbox(tmp_path, source):
    """numpy's implementation module holds the same percentile as numpy (the sandbox replaces both),
    and torch (in the course environment for vLLM) has its own linear quantile: both score 0."""
    ns = notebook_namespace(source)
    assert abs(ns["percentiles"]([1.0, 2.0, 3.0, 4.0], [99])[0] - 3.97) < 1e-9  # they do the job
    results = judge_in_sandbox(
        "09", {k: ns[k] for k in ("percentiles", "hidden_latency", "little_L")}, tmp_path
    )
    assert results["09.percentiles"].earned == 0, results["09.percentiles"].message
    assert results["09.coordinated_omission"].earned == 0, results["09.coordinated_omission"].message
    assert results["09.littles_law"].earned == results["09.littles_law"].points, results[
        "09.littles_law"
    ].message


@pytest.mark.slow
def test_numpy_percentile_is_refused_inside_the_sandbox(tmp_path):
    """The judge's sandbox replaces numpy's percentile by a stub that raises: an answer built on it
    scores 0 there, and the same submission's own work (little_L) still scores."""
    ns = notebook_namespace(_NUMPY_ANSWERS)
    results = judge_in_sandbox(
        "09", {k: ns[k] for k in ("percentiles", "hidden_latency", "little_L")}, tmp_path
    )
    assert results["09.percentiles"].earned == 0, results["09.percentiles"].message
    assert results["09.coordinated_omission"].earned == 0, results["09.coordinated_omission"].message
    assert results["09.littles_law"].earned == results["09.littles_law"].points, results[
        "09.littles_law"
    ].message


def test_load_generator_takes_a_length_mix(fake_server):  # noqa: F811  (the imported fixture)
    """Lab 09's ShareGPT workload: each request's max_tokens from the mix, reused in turn."""
    from lab_utils.clients import run_load

    url, state = fake_server
    res = run_load(url, "m", ["a"], num_requests=5, concurrency=2, max_tokens=4, output_lens=[1, 3])
    assert sorted(int(b["max_tokens"]) for b in state["bodies"]) == [1, 1, 1, 3, 3]
    assert [r.output_tokens for r in res.records] == [1, 3, 1, 3, 1]
    assert res.settings["output_lens"] == [1, 3]
    with pytest.raises(ValueError, match="output_lens"):
        run_load(url, "m", ["a"], num_requests=1, concurrency=1, output_lens=[0])
