"""Lab 09 — benchmarking and autoscaling: percentiles and goodput on unseen samples, the knee predicted
from the per-step cost, coordinated omission and Little's law re-derived from stamped runs, a
scaling policy graded on unseen traces against the bounds a reference policy meets, and the cost
per million tokens.

Measured answers (`co_run`, `sweep`) are objects `lab_utils.clients.run_load` and
`lab_utils.bench.load.run_sweep` returned and stamped in the run; the hidden checks verify the stamp
and recompute the graded figures from the raw per-request samples.
"""

from __future__ import annotations

from lab_utils.grading.checks import close, measured
from lab_utils.grading.registry import hidden, question, scenario

_GPUS = ["L4", "L40S", "A100-80GB", "H100-80GB"]


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


def _pct(xs, q):  # the reference: the load generator's percentile
    from lab_utils.clients.loadgen import percentile

    return percentile(xs, q)


@question(
    "09.percentiles",
    points=2,
    answers=["percentiles"],
    forbid=[
        "lab_utils.clients.loadgen:percentile",
        "lab_utils.bench.load:percentiles",
        "lab_utils.sim.metrics:percentile",
    ],
)
def _(percentiles):
    """Percentiles 0-100 of a sample, linear interpolation between sorted ranks."""
    got = [float(v) for v in percentiles([3.0, 1.0, 2.0, 4.0], [50, 99])]
    assert len(got) == 2, "one value per requested percentile, in the order asked"
    assert 2.0 < got[0] < 3.0, "sort first; with an even count the median lies between two samples"
    assert 3.9 < got[1] < 4.0, "a high percentile interpolates between its neighbouring ranks"
    assert [float(v) for v in percentiles([7.5], [0, 50, 100])] == [7.5] * 3, "one sample is every percentile"


@hidden("09.percentiles")
def _(percentiles, rng, scenario):
    wrong = 0
    for _ in range(20):
        xs = [round(rng.lognormvariate(-1, 0.8), 5) for _ in range(rng.randint(1, 80))]
        qs = [rng.choice([0, 25, 50, 90, 95, 99, 99.9, 100]) for _ in range(rng.randint(1, 4))]
        got = [float(v) for v in percentiles(list(xs), list(qs))]
        wrong += len(got) != len(qs) or not all(close(g, _pct(xs, q), 1e-9) for g, q in zip(got, qs))
    assert not wrong, f"wrong on {wrong} of 20 unseen latency samples"


# --- 09.goodput ---------------------------------------------------------------------------------


def _ref_goodput(records, ttft_slo, tpot_slo, duration):
    good = 0
    for r in records:
        if not r["ok"] or r["ttft"] is None:
            continue
        if r["ttft"] <= ttft_slo and (r["tpot"] is None or r["tpot"] <= tpot_slo):
            good += 1
    return good / duration


def _records(rng, n):
    out = []
    for _ in range(n):
        ok = rng.random() > 0.1
        out.append(
            {
                "ok": ok,
                "ttft": round(rng.expovariate(2.0), 4) if ok else None,
                "tpot": (round(rng.uniform(0.02, 0.4), 4) if rng.random() > 0.1 else None) if ok else None,
            }
        )
    return out


@question(
    "09.goodput",
    points=2,
    answers=["goodput"],
    forbid=["lab_utils.bench.load:goodput_rps", "lab_utils.sim.metrics:goodput"],
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


@hidden("09.goodput")
def _(goodput, rng, scenario):
    wrong = 0
    for _ in range(20):
        recs = _records(rng, rng.randint(1, 40))
        a, b, d = rng.choice([0.25, 0.5, 1.0, 2.0]), rng.choice([0.05, 0.1, 0.2]), rng.uniform(1, 30)
        wrong += not close(
            float(goodput([dict(r) for r in recs], a, b, d)), _ref_goodput(recs, a, b, d), 1e-9
        )
    assert not wrong, (
        f"wrong on {wrong} of 20 unseen runs (think about failed requests and one-token answers)"
    )


# --- 09.knee_rate (predict, then the sweep measures it) -----------------------------------------


def _ref_knee(f, p, n, b):
    return b / (n * (f + p * b))


@question(
    "09.knee_rate",
    points=3,
    answers=["knee_rate"],
    predict=True,
    forbid=["lab_utils.bench.load:knee_rate_model", "lab_utils.bench.autoscale:ReplicaModel.step"],
)
def _(knee_rate):
    """Requests/s a replica sustains from its step cost, output length and slot count."""
    a = float(knee_rate(0.02, 0.005, 16, 8))
    b = float(knee_rate(0.02, 0.005, 32, 8))
    assert a > 0, "a positive rate"
    assert 1.9 < a / b < 2.1, (
        "twice the output tokens per request: how many steps does each request hold a slot?"
    )


@hidden("09.knee_rate")
def _(knee_rate, rng, scenario):
    wrong = 0
    for _ in range(20):
        args = (rng.uniform(0.005, 0.05), rng.uniform(0.0, 0.01), rng.randint(4, 256), rng.randint(1, 64))
        wrong += not close(float(knee_rate(*args)), _ref_knee(*args), 1e-6)
    assert not wrong, f"wrong on {wrong} of 20 unseen step costs (prediction within 1e-6 of the model)"


# --- 09.coordinated_omission (measured) ----------------------------------------------------------


def _co_gap(run) -> float:
    from lab_utils.bench.load import intended_starts

    s = run.settings
    due = intended_starts(s["num_requests"], s["rate"], s.get("seed", 0))
    ok = [r for r in run.records if r.ok]
    return _pct([r.finish - due[r.request_id] for r in ok], 95) - _pct([r.e2e for r in ok], 95)


@question(
    "09.coordinated_omission",
    points=2,
    answers=["co_run", "co_hidden_s"],
    forbid=["lab_utils.bench.load:latency_from_intended"],
)
def _(co_run, co_hidden_s):
    """The capped open-loop run, and how much of its p95 latency the actual send times hide."""
    from lab_utils.clients.loadgen import LoadResult

    run = measured(co_run, LoadResult, "co_run", "run_load")
    assert run.settings.get("rate") and run.settings.get("concurrency"), (
        "an open-loop run (a rate) whose sends wait for a capped number of slots"
    )
    assert float(co_hidden_s) >= 0, "latency counted from when a request was due is never shorter"


@hidden("09.coordinated_omission")
def _(co_run, co_hidden_s, rng, scenario):
    from lab_utils.clients.loadgen import LoadResult

    run = measured(co_run, LoadResult, "co_run", "run_load")
    want = _co_gap(LoadResult.from_raw(run.raw_samples()))
    if not abs(float(co_hidden_s) - want) <= 1e-6 + 1e-6 * abs(want):
        raise AssertionError(
            "co_hidden_s is not p95 latency from the due times minus p95 from the send times"
        )


# --- 09.littles_law (measured) -------------------------------------------------------------------


@question(
    "09.littles_law", points=2, answers=["sweep", "little_L"], forbid=["lab_utils.bench.load:littles_law"]
)
def _(sweep, little_L):
    """The open-loop sweep, and lambda * W per level from the client's records."""
    from lab_utils.bench.load import Sweep

    sw = measured(sweep, Sweep, "sweep", "run_sweep")
    got = [float(v) for v in little_L]
    assert len(got) == len(sw.runs) >= 2, "one figure per level of the sweep"
    assert all(v > 0 for v in got), "a positive mean number of requests in the system"


@hidden("09.littles_law")
def _(sweep, little_L, rng, scenario):
    from lab_utils.bench.load import Sweep

    sw = Sweep.from_raw(measured(sweep, Sweep, "sweep", "run_sweep").raw_samples())
    got = [float(v) for v in little_L]
    wrong = 0
    for g, run in zip(got, sw.runs):
        ok = [r for r in run.records if r.ok]
        dur = run.settings["duration_s"]
        want = (len(ok) / dur) * (sum(r.e2e for r in ok) / len(ok))
        wrong += not abs(g - want) <= 0.01 * want
    assert not wrong and len(got) == len(sw.runs), f"lambda * W is off on {wrong} of {len(sw.runs)} levels"


# --- 09.scaling_policy (graded on unseen traces) ------------------------------------------------


def _model(scn):
    from lab_utils.bench.autoscale import ReplicaModel

    return ReplicaModel(**scn["replica"])


def _run(policy, trace, model):
    from lab_utils.bench.autoscale import simulate

    return simulate(trace, policy, model, interval_s=30, max_replicas=64)


@question(
    "09.scaling_policy", points=4, answers=["my_policy"], forbid=["lab_utils.bench.autoscale:capacity_policy"]
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


@hidden("09.scaling_policy")
def _(my_policy, rng, scenario):
    from lab_utils.bench.autoscale import capacity_policy, make_trace

    model = _model(scenario)
    passed, n = 0, 3
    for _ in range(n):
        tr = dict(scenario["trace"])
        tr["seed"] = rng.randint(0, 10**6)
        tr["hours"] = rng.choice([2, 3])
        trace = make_trace(**tr)
        ref = _run(capacity_policy, trace, model)
        mine = _run(my_policy, trace, model)
        # bounds the reference policy meets on this trace: its SLO attainment less 3 points (at most
        # 95% asked), and at most 25% more replica-hours
        slo_ok = mine.slo_attainment >= min(ref.slo_attainment, 0.95) - 0.03
        cost_ok = mine.replica_hours <= 1.25 * ref.replica_hours
        passed += slo_ok and cost_ok
    if passed == 0:
        raise AssertionError(f"the policy missed the SLO or cost bound on all {n} unseen traces")
    return passed / n


# --- 09.cost_per_mtok -----------------------------------------------------------------------------


@question(
    "09.cost_per_mtok",
    points=2,
    answers=["cost_per_mtok"],
    forbid=["lab_utils.bench.autoscale:AutoscaleRun.cost_per_million_tokens"],
)
def _(cost_per_mtok):
    """Dollars per million output tokens from the replicas paid each interval, the price and the tokens."""
    a = float(cost_per_mtok([2, 2, 4], 60, 3.0, 1_000_000))
    assert a > 0, "a positive price"
    assert close(float(cost_per_mtok([2, 2, 4], 60, 3.0, 2_000_000)), a / 2, 1e-9), (
        "twice the tokens for the same replica time: half the price per token"
    )


@hidden("09.cost_per_mtok")
def _(cost_per_mtok, rng, scenario):
    from lab_utils.memory import get_gpu

    wrong = 0
    for k in range(15):
        reps = [rng.randint(0, 12) for _ in range(rng.randint(1, 200))]
        interval = rng.choice([10, 30, 60])
        price = get_gpu(scenario["gpu"]).price_per_hour if k == 0 else round(rng.uniform(0.5, 6), 2)
        tokens = rng.randint(10_000, 10**9)
        want = sum(reps) * interval / 3600 * price / (tokens / 1e6)
        wrong += not close(float(cost_per_mtok(list(reps), interval, price, tokens)), want, 1e-9)
    assert not wrong, f"wrong on {wrong} of 15 unseen runs"
