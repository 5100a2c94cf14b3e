"""Lab 11 — interview drills: graded questions.

The calculators are graded on unseen random instances against `lab_utils.drills.calc`; the drill
answers against the drill set the grader regenerates from the scenario's seed; the batching
prediction against the reference model for the scenario's workload; the measurement by its
provenance stamp and the finish times it carries. Public checks use at most two fixed cases and
never show an expected value.
"""

from __future__ import annotations

import math
import random

from lab_utils.drills import TOPICS, calc, make_drills
from lab_utils.grading.checks import close, partial
from lab_utils.grading.registry import hidden, question, scenario

CALC = "lab_utils.drills.calc"


@scenario("11")
def _(rng: random.Random) -> dict:
    """The drill set's seed, a batching workload to predict and measure, a chat design prompt."""
    batch = rng.choice([4, 8, 16])
    n_short = rng.randint(batch // 2, batch - 1)
    short, long = rng.choice([20, 50, 100]), rng.choice([300, 500, 1000])
    lens: list[int] = []
    for _ in range(8):  # eight batches, each with the same mix in a shuffled order
        one = [short] * n_short + [long] * (batch - n_short)
        rng.shuffle(one)
        lens += one
    return {
        "drill_seed": rng.randrange(1, 1_000_000),
        "n_drills": 12,
        "batching": {"batch_size": batch, "output_lens": lens, "prompt_len": 32},
        "chat": {
            "rate": rng.choice([500, 1000, 2000, 3000]),
            "output_tokens": rng.choice([150, 250, 400]),
            "tokens_per_s_per_replica": rng.choice([2500, 4000, 6000, 9000]),
            "headroom": 0.7,
        },
    }


# --- 1. GPUs needed under the tensor-parallel constraints ---------------------------------------


@question("11.gpus_needed", points=3, answers=["gpus_needed"], forbid=[f"{CALC}:gpus_needed"])
def _(gpus_needed):
    """Smallest TP degree that fits weights and KV per GPU, divides attention and KV heads, <= 8."""
    got = gpus_needed(140.0, 20.0, 80.0, 0.9, 3.0, 64, 8)
    assert got is not None, "140 GB of weights plus 20 GB of KV do fit on some count of 80 GB GPUs"
    assert int(got) != 2, "round the memory ratio UP: 2 GPUs leave less usable memory than the model needs"
    assert int(got) != 3, (
        "3 does not divide 64 attention heads and 8 KV heads; take the next degree that does"
    )
    assert int(got) == calc.gpus_needed(140.0, 20.0, 80.0, 0.9, 3.0, 64, 8), (
        "usable per GPU = utilization x memory - reserve; weights and KV split evenly over the TP degree"
    )
    assert gpus_needed(1400.0, 20.0, 80.0, 0.9, 3.0, 64, 8) is None, (
        "when not even 8 GPUs in the node hold it, return None"
    )


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


# --- 2. Where decode turns compute-bound ----------------------------------------------------------


@question(
    "11.critical_batch",
    points=2,
    answers=["critical_batch"],
    forbid=[f"{CALC}:critical_batch", f"{CALC}:ridge_point"],
)
def _(critical_batch):
    """Decode batch at which weight-streaming intensity reaches the GPU's ridge point."""
    a = float(critical_batch(989, 3350, 2))
    b = float(critical_batch(989, 3350, 1))
    assert a > 0 and b > 0, "a batch size is positive"
    assert math.isclose(a, 2 * b, rel_tol=1e-6), "halving the bytes per weight should halve this batch: why?"
    assert close(a, calc.critical_batch(989, 3350, 2)), (
        "ridge point = peak FLOP/s over bytes/s; a decode step does 2 FLOPs per weight per sequence"
    )


@hidden("11.critical_batch")
def _(critical_batch, rng, scenario):
    ok, n = 0, 20
    for _ in range(n):
        args = (rng.uniform(50, 2500), rng.uniform(200, 8000), rng.choice([0.5, 1.0, 2.0, 4.0]))
        ok += close(critical_batch(*args), calc.critical_batch(*args))
    return partial(ok, n, "GPUs")


# --- 3. Continuous vs static batching --------------------------------------------------------------


@question("11.batching_gain", points=2, answers=["batching_gain"], forbid=[f"{CALC}:batching_gain"])
def _(batching_gain):
    """Throughput of continuous over static batching for output lengths taken in order."""
    assert close(batching_gain([100] * 8, 8), 1.0), (
        "when every request has the same length there is nothing to gain"
    )
    got = float(batching_gain([50] * 7 + [500], 8))
    assert not close(got, 10.0, 0.05), (
        "the seed's ~10x is long/short; continuous batching pays each request's own length"
    )
    assert close(got, calc.batching_gain([50] * 7 + [500], 8)), (
        "static: each batch costs its longest request; continuous: slots never idle"
    )


@hidden("11.batching_gain")
def _(batching_gain, rng, scenario):
    ok, n = 0, 20
    for _ in range(n):
        b = rng.randint(1, 16)
        lens = [rng.randint(1, 2000) for _ in range(rng.randint(1, 60))]
        ok += close(batching_gain(lens, b), calc.batching_gain(lens, b))
    return partial(ok, n, "workloads")


# --- 4. Speculative decoding -----------------------------------------------------------------------


@question(
    "11.speculative",
    points=2,
    answers=["spec_expected_tokens", "spec_speedup"],
    forbid=[f"{CALC}:spec_expected_tokens", f"{CALC}:spec_speedup"],
)
def _(spec_expected_tokens, spec_speedup):
    """Expected tokens per target pass, and the speed-up once the draft's cost is paid."""
    assert close(spec_expected_tokens(0.0, 4), 1.0), "with nothing accepted, the target still adds one token"
    e = float(spec_expected_tokens(0.8, 4))
    assert 1 < e < 5, "between one token and k + 1 tokens per pass"
    assert close(e, calc.spec_expected_tokens(0.8, 4)), (
        "a geometric series: each draft survives only if all before it did"
    )
    assert float(spec_speedup(0.8, 4, 0.1)) < e, "the draft's k steps cost time too"
    assert close(spec_speedup(0.8, 4, 0.1), calc.spec_speedup(0.8, 4, 0.1)), (
        "divide tokens per round by the round's cost in target steps"
    )


@hidden("11.speculative")
def _(spec_expected_tokens, spec_speedup, rng, scenario):
    ok, n = 0, 20
    for _ in range(n):
        a, k, c = round(rng.uniform(0.05, 0.95), 3), rng.randint(1, 10), round(rng.uniform(0.01, 0.5), 3)
        ok += close(spec_expected_tokens(a, k), calc.spec_expected_tokens(a, k)) and close(
            spec_speedup(a, k, c), calc.spec_speedup(a, k, c)
        )
    return partial(ok, n, "(alpha, k, cost) cases")


# --- 5. Cost per million tokens --------------------------------------------------------------------


@question(
    "11.cost_per_million",
    points=1,
    answers=["cost_per_million_tokens"],
    forbid=[f"{CALC}:cost_per_million_tokens"],
)
def _(cost_per_million_tokens):
    """Dollars per million output tokens from an hourly GPU price and a sustained throughput."""
    a = float(cost_per_million_tokens(2.5, 1, 1000))
    assert close(cost_per_million_tokens(2.5, 2, 1000), 2 * a), (
        "twice the GPUs at the same throughput cost twice as much"
    )
    assert close(a, calc.cost_per_million_tokens(2.5, 1, 1000)), "an hour has 3600 seconds; a million is 1e6"


@hidden("11.cost_per_million")
def _(cost_per_million_tokens, rng, scenario):
    ok, n = 0, 15
    for _ in range(n):
        args = (round(rng.uniform(0.3, 8), 2), rng.randint(1, 16), rng.uniform(50, 50_000))
        ok += close(cost_per_million_tokens(*args), calc.cost_per_million_tokens(*args))
    return partial(ok, n, "price and throughput cases")


# --- 6. The seeded drill set -----------------------------------------------------------------------

_ALL_CALC = [
    f"{CALC}:{name}"
    for name in (
        "gpus_needed",
        "critical_batch",
        "ridge_point",
        "batching_gain",
        "spec_expected_tokens",
        "spec_speedup",
        "cost_per_million_tokens",
        "prefill_ttft_s",
        "littles_law_concurrency",
        "max_rate",
        "goodput",
        "batch1_decode_tokens_per_s",
        "prefill_saved_fraction",
        "cached_prefix_tokens",
        "replicas_needed",
    )
]


@question("11.drill_answers", points=4, answers=["answer_drill", "drill_answers"], forbid=_ALL_CALC)
def _(answer_drill, drill_answers):
    """answer_drill(kind, inputs) answers any drill; drill_answers answers the scenario's set."""
    values = [float(v) for v in list(drill_answers)]
    assert values and all(math.isfinite(v) for v in values), "one finite number per drill of DRILLS, in order"
    d = make_drills(0, topics=["cost"], n=1)[0]
    assert d.is_correct(answer_drill(d.kind, dict(d.inputs))), (
        f"answer_drill is wrong on a {d.kind!r} drill: read its worked explanation"
    )


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


# --- 7. Predict, then measure ----------------------------------------------------------------------


@question("11.predict_batching", points=2, answers=["predicted_gain"], predict=True)
def _(predicted_gain):
    """Predicted continuous-over-static gain for SCENARIO's workload, before the simulator runs it."""
    g = float(predicted_gain)
    assert math.isfinite(g) and g >= 1, (
        "continuous batching never does worse than static in this model: a factor >= 1"
    )


@hidden("11.predict_batching")
def _(predicted_gain, rng, scenario):
    b = scenario["batching"]
    assert close(predicted_gain, calc.batching_gain(b["output_lens"], b["batch_size"]), 0.01), (
        "the prediction does not follow from the scenario's workload"
    )


@question("11.measured_batching", points=2, answers=["batching_measurement"])
def _(batching_measurement):
    """The simulator's static and continuous runs of SCENARIO's workload (measure_batching_gain)."""
    from lab_utils.grading.provenance import verify

    assert verify(batching_measurement), (
        "use the object measure_batching_gain returned in this run, unchanged"
    )
    assert float(batching_measurement.gain) > 1, "continuous batching should finish this workload sooner"


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


# --- 8. A design number from the scenario ----------------------------------------------------------


@question("11.chat_replicas", points=1, answers=["chat_replicas"])
def _(chat_replicas):
    """Replicas for SCENARIO['chat'] at the stated headroom (a whole number)."""
    n = float(chat_replicas)
    assert n >= 1 and n == int(n), "a whole number of replicas, at least one"


@hidden("11.chat_replicas")
def _(chat_replicas, rng, scenario):
    c = scenario["chat"]
    want = calc.replicas_needed(c["rate"], c["output_tokens"], c["tokens_per_s_per_replica"], c["headroom"])
    assert close(chat_replicas, want), "the replica count does not follow from the scenario's chat prompt"
