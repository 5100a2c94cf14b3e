"""Lab 11: hidden checks (the grader's; never inside a sandbox).

Cases come from the judge's key, not the notebook's SEED; public checks and the scenario are in
`lab_utils.grading.questions.lab11`.
"""

from __future__ import annotations

from grader.registry import hidden
from lab_utils.drills import TOPICS, calc, make_drills
from lab_utils.grading.checks import close, partial


@hidden("11.gpus_needed")
def _(gpus_needed, rng, scenario):
    ok, n = 0, 30
    for _ in range(n):
        heads_kv = rng.choice([(32, 8), (64, 8), (28, 4), (40, 8), (9, 3), (48, 16)])
        args = (
            round(rng.uniform(5, 900), 1),
            round(rng.uniform(0, 200), 1),
            rng.choice([24.0, 48.0, 80.0, 141.0]),
            rng.choice([0.8, 0.9, 0.95]),
            rng.choice([1.0, 2.0, 4.0]),
            *heads_kv,
        )
        want = calc.gpus_needed(*args)
        got = gpus_needed(*args)
        ok += (got is None) if want is None else (got is not None and close(got, want))
    return partial(ok, n, "sizing cases")


@hidden("11.critical_batch")
def _(critical_batch, rng, scenario):
    ok, n = 0, 20
    for _ in range(n):
        args = (rng.uniform(50, 2500), rng.uniform(200, 8000), rng.choice([0.5, 1.0, 2.0, 4.0]))
        ok += close(critical_batch(*args), calc.critical_batch(*args))
    return partial(ok, n, "GPUs")


@hidden("11.batching_gain")
def _(batching_gain, rng, scenario):
    ok, n = 0, 20
    for _ in range(n):
        b = rng.randint(1, 16)
        lens = [rng.randint(1, 2000) for _ in range(rng.randint(1, 60))]
        ok += close(batching_gain(lens, b), calc.batching_gain(lens, b))
    return partial(ok, n, "workloads")


@hidden("11.speculative")
def _(spec_expected_tokens, spec_speedup, rng, scenario):
    ok, n = 0, 20
    for _ in range(n):
        a, k, c = round(rng.uniform(0.05, 0.95), 3), rng.randint(1, 10), round(rng.uniform(0.01, 0.5), 3)
        ok += close(spec_expected_tokens(a, k), calc.spec_expected_tokens(a, k)) and close(
            spec_speedup(a, k, c), calc.spec_speedup(a, k, c)
        )
    return partial(ok, n, "(alpha, k, cost) cases")


@hidden("11.cost_per_million")
def _(cost_per_million_tokens, rng, scenario):
    ok, n = 0, 15
    for _ in range(n):
        args = (round(rng.uniform(0.3, 8), 2), rng.randint(1, 16), rng.uniform(50, 50_000))
        ok += close(cost_per_million_tokens(*args), calc.cost_per_million_tokens(*args))
    return partial(ok, n, "price and throughput cases")


@hidden("11.drill_answers")
def _(answer_drill, drill_answers, rng, scenario):
    mine = make_drills(scenario["drill_seed"], n=scenario["n_drills"])
    values = list(drill_answers)
    right = sum(1 for d, v in zip(mine, values) if d.is_correct(v)) if len(values) == len(mine) else 0
    fresh = make_drills(rng.randrange(10**9), n=3 * len(TOPICS))
    solved = 0
    for d in fresh:
        try:
            solved += d.is_correct(answer_drill(d.kind, dict(d.inputs)))
        except Exception:
            pass
    if right == 0 or solved == 0:
        raise AssertionError(
            f"drills right: {right} of {len(mine)} in the set, {solved} of {len(fresh)} unseen"
        )
    frac = (right / len(mine)) * (solved / len(fresh))
    return None if frac == 1 else frac


@hidden("11.predict_batching")
def _(predicted_gain, rng, scenario):
    b = scenario["batching"]
    assert close(predicted_gain, calc.batching_gain(b["output_lens"], b["batch_size"]), 0.01), (
        "the prediction does not follow from the scenario's workload"
    )


@hidden("11.measured_batching")
def _(batching_measurement, rng, scenario):
    from lab_utils.grading.provenance import verify

    assert verify(batching_measurement), "the measurement does not come from this run's measuring code"
    raw = batching_measurement.raw_samples()
    b = scenario["batching"]
    assert [int(x) for x in raw["output_lens"]] == list(b["output_lens"]) and int(raw["batch_size"]) == b[
        "batch_size"
    ], "measure the scenario's workload and batch size"
    static, cont = raw["static_finish_s"], raw["continuous_finish_s"]
    assert len(static) == len(cont) == len(b["output_lens"]) and max(static) > max(cont) > 0, (
        "the finish times do not describe the two runs"
    )


@hidden("11.chat_replicas")
def _(chat_replicas, rng, scenario):
    c = scenario["chat"]
    want = calc.replicas_needed(c["rate"], c["output_tokens"], c["tokens_per_s_per_replica"], c["headroom"])
    assert close(chat_replicas, want), "the replica count does not follow from the scenario's chat prompt"
