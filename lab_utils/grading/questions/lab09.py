"""Lab 09 — benchmarking and autoscaling: percentiles and goodput on unseen samples, the knee predicted
from the per-step cost (prefill included), the latency a coordinated generator hides and the mean
number of requests in the system computed from raw load records, a scaling policy graded on unseen
traces against the bounds a reference policy meets, and the cost per million tokens.

Every answer is a function. The notebook applies the analysis functions to its own measured runs;
the hidden checks (grader/hidden/lab09.py) call them on load records they make up.
"""

from __future__ import annotations

from lab_utils.grading.checks import close
from lab_utils.grading.forbidden import refs
from lab_utils.grading.registry import limits, question, scenario

_GPUS = ["L4", "L40S", "A100-80GB", "H100-80GB"]


# graded as submitted (LIGHT = False): the kernel and its vLLM server(s), proportional set size
limits("09", memory_mb=8192, timeout=1800)


@scenario("09")
def _(rng):
    """The SLO of the real sweep, the replica model and trace of the autoscaling study, the GPU priced."""
    return {
        "ttft_slo_s": rng.choice([0.75, 1.0, 1.5, 2.0]),
        "tpot_slo_s": rng.choice([0.15, 0.2, 0.25, 0.3]),
        "replica": {
            "fixed_s": rng.choice([0.02, 0.025, 0.03]),
            "per_seq_s": rng.choice([0.003, 0.004, 0.006]),
            "max_seqs": rng.choice([8, 16]),
            "output_tokens": rng.choice([48, 64, 96]),
            "input_tokens": 64,
            "cold_start_s": rng.choice([35.0, 60.0, 90.0]),
            "ttft_slo_s": rng.choice([1.5, 2.0, 3.0]),
            "tpot_slo_s": 0.2,
        },
        "trace": {
            "hours": rng.choice([3, 4]),
            "base_rps": rng.choice([2.0, 4.0, 6.0]),
            "peak_rps": rng.choice([15.0, 20.0, 30.0]),
            "bursts": rng.randint(3, 8),
            "seed": rng.randint(0, 10_000),
        },
        "gpu": rng.choice(_GPUS),
    }


# --- 09.percentiles -----------------------------------------------------------------------------


@question(
    "09.percentiles",
    points=2,
    answers=["percentiles"],
    forbid=refs("percentiles", "percentile_summaries"),
)
def _(percentiles):
    """Percentiles 0-100 of a sample, linear interpolation between sorted ranks."""
    got = [float(v) for v in percentiles([3.0, 1.0, 2.0, 4.0], [50, 99])]
    assert len(got) == 2, "one value per requested percentile, in the order asked"
    assert 2.0 < got[0] < 3.0, "sort first; with an even count the median lies between two samples"
    assert 3.9 < got[1] < 4.0, "a high percentile interpolates between its neighbouring ranks"
    assert [float(v) for v in percentiles([7.5], [0, 50, 100])] == [7.5] * 3, "one sample is every percentile"


# --- 09.goodput ---------------------------------------------------------------------------------


@question(
    "09.goodput",
    points=2,
    answers=["goodput"],
    forbid=refs("goodput"),
)
def _(goodput):
    """Requests per second meeting both the TTFT and the TPOT target."""
    recs = [
        {"ok": True, "ttft": 0.2, "tpot": 0.05},
        {"ok": True, "ttft": 0.3, "tpot": 0.5},
        {"ok": False, "ttft": None, "tpot": None},
        {"ok": True, "ttft": 2.0, "tpot": 0.05},
    ]
    g = float(goodput(recs, 1.0, 0.1, 2.0))
    assert 0 <= g <= 2.0, "goodput is a rate of requests over the run's duration, at most the request rate"
    assert g < 1.5, "a request must meet both targets, and a failed one meets nothing"
    assert float(goodput(recs, 10.0, 10.0, 4.0)) < float(goodput(recs, 10.0, 10.0, 2.0)), (
        "the same requests over a longer run are a lower rate"
    )


# --- 09.knee_rate (predict, then the sweep measures it) -----------------------------------------


@question(
    "09.knee_rate",
    points=3,
    answers=["knee_rate"],
    predict=True,
    forbid=refs("knee"),
)
def _(knee_rate):
    """knee_rate(fixed_s, per_token_s, input_tokens, output_tokens, max_seqs): requests/s a replica
    sustains with every slot busy, each step paying for the tokens it carries (prefills included)."""
    a = float(knee_rate(0.02, 0.005, 16, 32, 8))
    assert a > 0, "a positive rate"
    assert float(knee_rate(0.02, 0.005, 400, 32, 8)) < a, (
        "a long prompt is work too: which step processes it, and what does that step cost?"
    )
    assert float(knee_rate(0.02, 0.005, 16, 64, 8)) < a, "longer answers hold each slot for more steps"


# --- 09.coordinated_omission (an analysis of raw load records) ------------------------------------


@question(
    "09.coordinated_omission",
    points=2,
    answers=["hidden_latency"],
    forbid=refs("coordinated_omission", "percentiles", "percentile_summaries"),
)
def _(hidden_latency):
    """hidden_latency(records, q): how much of the q-th percentile latency a generator that times
    each request from its actual send would not report. Records: due, sent, finish, error."""
    recs = [
        {"request_id": 0, "due": 0.0, "sent": 0.0, "finish": 1.0, "error": None},
        {"request_id": 1, "due": 0.1, "sent": 1.0, "finish": 2.0, "error": None},
        {"request_id": 2, "due": 0.2, "sent": 2.0, "finish": 3.0, "error": None},
    ]
    got = float(hidden_latency([dict(r) for r in recs], 50))
    assert got > 0, "these requests waited in the client before they were sent: that wait is hidden"
    none = [dict(r, sent=r["due"]) for r in recs]
    assert abs(float(hidden_latency(none, 95))) < 1e-9, "sent on time, nothing is hidden"


# --- 09.littles_law (an analysis of raw load records) ---------------------------------------------


@question("09.littles_law", points=2, answers=["little_L"], forbid=refs("littles_law"))
def _(little_L):
    """little_L(records, t0, t1): the mean number of requests inside the system over [t0, t1],
    from each request's start and finish (None: still inside when the records end)."""
    one = float(little_L([{"start": 0.0, "finish": 10.0}], 0.0, 10.0))
    assert close(one, 1.0, 1e-9), "one request inside for the whole window"
    got = float(little_L([{"start": 0.0, "finish": 5.0}, {"start": 8.0, "finish": None}], 2.0, 10.0))
    assert 0 < got < 2, "a mean over the window, counting only the time each request spent inside it"


# --- 09.scaling_policy (graded on unseen traces) ------------------------------------------------


def _run(policy, trace, model):
    from lab_utils.bench.autoscale import simulate

    return simulate(trace, policy, model, interval_s=30, max_replicas=64)


@question(
    "09.scaling_policy",
    points=4,
    answers=["my_policy"],
    forbid=refs("scaling_policies"),
)
def _(my_policy):
    """A scaling policy: observation dict -> desired replicas; meets the SLO on a public one-hour trace."""
    from lab_utils.bench.autoscale import ReplicaModel, make_trace

    obs = {
        "t": 30.0,
        "replicas": 2,
        "ready": 2,
        "rps": 3.0,
        "queue": 0.0,
        "running": 3.0,
        "kv_usage": 0.4,
        "util": 0.95,
        "ttft_p95": 0.3,
        "capacity_rps": 2.0,
        "max_seqs": 8,
        "interval_s": 30,
        "min_replicas": 1,
        "max_replicas": 64,
        "cold_start_s": 40.0,
        "ttft_slo_s": 2.0,
    }
    assert int(my_policy(dict(obs))) >= 1, "return a whole number of replicas, at least one"
    run = _run(my_policy, make_trace(1.0, base_rps=3, peak_rps=12, bursts=2, seed=1), ReplicaModel())
    assert run.slo_attainment >= 0.85, (
        "on a public one-hour trace fewer than 85% of requests met the SLO: "
        "react to the load before a queue forms, and to the queue when one does"
    )


# --- 09.cost_per_mtok -----------------------------------------------------------------------------


@question(
    "09.cost_per_mtok",
    points=2,
    answers=["cost_per_mtok"],
    forbid=refs("cost_per_token"),
)
def _(cost_per_mtok):
    """Dollars per million output tokens from the replicas paid each interval, the price and the tokens."""
    a = float(cost_per_mtok([2, 2, 4], 60, 3.0, 1_000_000))
    assert a > 0, "a positive price"
    assert close(float(cost_per_mtok([2, 2, 4], 60, 3.0, 2_000_000)), a / 2, 1e-9), (
        "twice the tokens for the same replica time: half the price per token"
    )
