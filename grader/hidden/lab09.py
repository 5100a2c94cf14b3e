"""Lab 09: hidden checks (the grader's; never inside a sandbox).

Cases come from the judge's key, not the notebook's SEED; public checks and the scenario are in
`lab_utils.grading.questions.lab09`.
"""

from __future__ import annotations

from grader.registry import hidden
from lab_utils.grading.checks import close, measured
from lab_utils.grading.questions.lab09 import _run


def _pct(xs, q):  # the reference: the load generator's percentile
    from lab_utils.clients.loadgen import percentile

    return percentile(xs, q)


@hidden("09.percentiles")
def _(percentiles, rng, scenario):
    wrong = 0
    for _ in range(20):
        xs = [round(rng.lognormvariate(-1, 0.8), 5) for _ in range(rng.randint(1, 80))]
        qs = [rng.choice([0, 25, 50, 90, 95, 99, 99.9, 100]) for _ in range(rng.randint(1, 4))]
        got = [float(v) for v in percentiles(list(xs), list(qs))]
        wrong += len(got) != len(qs) or not all(close(g, _pct(xs, q), 1e-9) for g, q in zip(got, qs))
    assert not wrong, f"wrong on {wrong} of 20 unseen latency samples"


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


def _ref_knee(f, p, n, b):
    return b / (n * (f + p * b))


@hidden("09.knee_rate")
def _(knee_rate, rng, scenario):
    wrong = 0
    for _ in range(20):
        args = (rng.uniform(0.005, 0.05), rng.uniform(0.0, 0.01), rng.randint(4, 256), rng.randint(1, 64))
        wrong += not close(float(knee_rate(*args)), _ref_knee(*args), 1e-6)
    assert not wrong, f"wrong on {wrong} of 20 unseen step costs (prediction within 1e-6 of the model)"


def _co_gap(run) -> float:
    from lab_utils.bench.load import intended_starts

    s = run.settings
    due = intended_starts(s["num_requests"], s["rate"], s.get("seed", 0))
    ok = [r for r in run.records if r.ok]
    return _pct([r.finish - due[r.request_id] for r in ok], 95) - _pct([r.finish - r.sent for r in ok], 95)


@hidden("09.coordinated_omission")
def _(co_run, co_hidden_s, rng, scenario):
    from lab_utils.clients.loadgen import LoadResult

    run = measured(co_run, LoadResult, "co_run", "run_load")
    want = _co_gap(LoadResult.from_raw(run.raw_samples()))
    if not abs(float(co_hidden_s) - want) <= 1e-6 + 1e-6 * abs(want):
        raise AssertionError(
            "co_hidden_s is not p95 latency from the due times minus p95 from the send times"
        )


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


def _model(scn):
    from lab_utils.bench.autoscale import ReplicaModel

    return ReplicaModel(**scn["replica"])


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
