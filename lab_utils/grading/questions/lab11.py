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

from lab_utils.drills import calc, make_drills
from lab_utils.grading.checks import close
from lab_utils.grading.registry import question, scenario

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


# --- 7. Predict, then measure ----------------------------------------------------------------------


@question("11.predict_batching", points=2, answers=["predicted_gain"], predict=True)
def _(predicted_gain):
    """Predicted continuous-over-static gain for SCENARIO's workload, before the simulator runs it."""
    g = float(predicted_gain)
    assert math.isfinite(g) and g >= 1, (
        "continuous batching never does worse than static in this model: a factor >= 1"
    )


@question("11.measured_batching", points=2, answers=["batching_measurement"])
def _(batching_measurement):
    """The simulator's static and continuous runs of SCENARIO's workload (measure_batching_gain)."""
    from lab_utils.grading.provenance import verify

    assert verify(batching_measurement), (
        "use the object measure_batching_gain returned in this run, unchanged"
    )
    assert float(batching_measurement.gain) > 1, "continuous batching should finish this workload sooner"


# --- 8. A design number from the scenario ----------------------------------------------------------


@question("11.chat_replicas", points=1, answers=["chat_replicas"])
def _(chat_replicas):
    """Replicas for SCENARIO['chat'] at the stated headroom (a whole number)."""
    n = float(chat_replicas)
    assert n >= 1 and n == int(n), "a whole number of replicas, at least one"
