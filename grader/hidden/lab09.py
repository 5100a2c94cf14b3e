"""Lab 09: hidden checks (the grader's; never inside a sandbox).

Cases come from the judge's key, not the notebook's SEED; public checks and the scenario are in
`lab_utils.grading.questions.lab09`.
"""

from __future__ import annotations

import math

from grader.registry import hidden
from lab_utils.grading.checks import close, frac_wrong
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
    frac_wrong(wrong, 20, "unseen latency samples")


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


def _ref_knee(f, c, p, n, b):
    """Every slot busy: a request holds a slot for n steps; its prompt's p tokens ride in the step
    that produces its first token, its other n - 1 tokens in one step each. Per request the fleet
    of slots spends n/b slot-steps' share of the fixed cost and c per token it processes."""
    return 1.0 / (n * f / b + c * (p + n - 1))


@hidden("09.knee_rate")
def _(knee_rate, rng, scenario):
    wrong = 0
    for _ in range(20):
        args = (
            rng.uniform(0.005, 0.05),
            rng.uniform(0.0, 0.01),
            rng.choice([1, 8, 64, 256, 1024, 3000]),
            rng.randint(4, 256),
            rng.randint(1, 64),
        )
        wrong += not close(float(knee_rate(*args)), _ref_knee(*args), 1e-6)
    frac_wrong(wrong, 20, "unseen step costs and lengths (prediction within 1e-6 of the model)")


def _load_records(rng) -> tuple[list[dict], float]:
    """An unseen open-loop run through a capped number of connections: Poisson due times, sends that
    wait for a free connection, service times, a few failures. Returns (records, rate)."""
    n = rng.randint(5, 300)
    rate = rng.uniform(0.5, 20.0)
    cap = rng.choice([1, 2, 4, 8, 10**6])
    service = rng.uniform(0.05, 2.0)
    t, due = 0.0, []
    for _ in range(n):
        due.append(round(t, 6))
        t += rng.expovariate(rate)
    free = [0.0] * min(cap, n)  # when each connection frees
    out = []
    for i, d in enumerate(due):
        k = min(range(len(free)), key=free.__getitem__)
        sent = max(d, free[k]) + rng.uniform(0, 0.002)
        fails = rng.random() < 0.05
        finish = sent + service * rng.lognormvariate(0, 0.5) * (0.2 if fails else 1.0)
        free[k] = finish
        out.append(
            {
                "request_id": i,
                "due": d,
                "sent": round(sent, 6),
                "finish": None if fails and rng.random() < 0.5 else round(finish, 6),
                "error": "HTTP 500: overloaded" if fails else None,
            }
        )
    rng.shuffle(out)  # records in completion or any order: the ids tie them to the schedule
    return out, rate


def _ref_hidden(records, q):
    done = [r for r in records if r["error"] is None and r["finish"] is not None]
    from_due = _pct([r["finish"] - r["due"] for r in done], q)
    from_sent = _pct([r["finish"] - r["sent"] for r in done], q)
    return from_due - from_sent


@hidden("09.coordinated_omission")
def _(hidden_latency, rng, scenario):
    wrong, n = 0, 20
    for _ in range(n):
        recs, _rate = _load_records(rng)
        if not any(r["error"] is None and r["finish"] is not None for r in recs):
            recs[0].update(error=None, finish=recs[0]["sent"] + 1.0)
        q = rng.choice([50, 90, 95, 99])
        got = float(hidden_latency([dict(r) for r in recs], q))
        wrong += not close(got, _ref_hidden(recs, q), 1e-6, 1e-9)
    frac_wrong(wrong, n, "unseen load runs")


def _ref_L(records, t0, t1):
    inside = 0.0
    for r in records:
        end = t1 if r["finish"] is None else min(r["finish"], t1)
        inside += max(0.0, end - max(r["start"], t0))
    return inside / (t1 - t0)


@hidden("09.littles_law")
def _(little_L, rng, scenario):
    wrong, n = 0, 20
    for _ in range(n):
        recs, _rate = _load_records(rng)
        recs = [{"start": r["due"], "finish": r["finish"]} for r in recs]
        last = max((r["finish"] or r["start"]) for r in recs)
        t0 = rng.choice([0.0, rng.uniform(0, last / 2)])
        t1 = rng.choice([last, rng.uniform(t0 + 0.1, last + 1), last + rng.uniform(0, 5)])
        t1 = max(t1, t0 + 0.1)
        wrong += not close(float(little_L([dict(r) for r in recs], t0, t1)), _ref_L(recs, t0, t1), 1e-6, 1e-9)
    frac_wrong(wrong, n, "unseen load runs and windows")


def _model(scn):
    from lab_utils.bench.autoscale import ReplicaModel

    return ReplicaModel(**scn["replica"])


def capacity_policy(obs: dict, target: float = 0.7) -> int:
    """The bound-setter: replicas for the observed rate at `target` of capacity, plus what drains the queue."""
    need = obs["rps"] / (target * obs["capacity_rps"])
    drain = obs["queue"] / (obs["capacity_rps"] * obs["interval_s"])
    return max(1, math.ceil(need + drain))


@hidden("09.scaling_policy")
def _(my_policy, rng, scenario):
    from lab_utils.bench.autoscale import make_trace

    model = _model(scenario)
    # the scenario's traffic at half, the same and twice its rates (in an order of the judge's key):
    # a fleet of fixed size tuned on the notebook's own trace fits one of them at most
    scales = [0.5, 1.0, 2.0]
    rng.shuffle(scales)
    passed, n = 0, len(scales)
    for scale in scales:
        tr = dict(scenario["trace"])
        tr["seed"] = rng.randint(0, 10**6)
        tr["hours"] = rng.choice([2, 3])
        tr["base_rps"], tr["peak_rps"] = tr["base_rps"] * scale, tr["peak_rps"] * scale
        tr["burst_rps"] = 15.0 * scale  # make_trace's default burst height, scaled
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
