"""Lab 03: hidden checks (the grader's; never inside a sandbox).

Cases come from the judge's key, not the notebook's SEED; public checks and the scenario are in
`lab_utils.grading.questions.lab03`.
"""

from __future__ import annotations

from grader.registry import hidden
from lab_utils.grading.checks import close, partial
from lab_utils.grading.questions.lab03 import _preferred, _same_plans


def scenario_batch(s: dict) -> list:
    """The section-1 batch of scenario `s` (a workload for the simulator)."""
    from lab_utils.sim import fixed_workload

    outs = [s["short_len"]] * (s["batch_size"] - 1) + [s["long_len"]]
    return fixed_workload([s["prompt_len"]] * len(outs), outs)


def scenario_cost(s: dict):
    """The section-1 step cost model of scenario `s`."""
    from lab_utils.sim import StepCostModel

    return StepCostModel(fixed_s=s["fixed_ms"] / 1e3, per_token_s=s["per_token_ms"] / 1e3)


def triton_scenario(s: dict):
    """(workload, cost model) of scenario `s`'s dynamic-batcher exercise."""
    from lab_utils.sim import StepCostModel, poisson_workload

    workload = poisson_workload(
        s["triton_num_requests"], s["triton_rate"], prompt_len=1, output_len=1, seed=s["triton_seed"]
    )
    return workload, StepCostModel(
        fixed_s=s["triton_fixed_ms"] / 1e3, per_token_s=s["triton_per_item_ms"] / 1e3
    )


def _simulated_utilisation(lens: list[int]) -> float:
    from lab_utils.sim import StaticBatching, StepCostModel, fixed_workload, simulate, summarize

    run = simulate(
        fixed_workload([1] * len(lens), list(lens)),
        StaticBatching(len(lens)),
        StepCostModel(fixed_s=0.01, per_token_s=0.0),
    )
    return summarize(run).slot_utilisation


@hidden("03.static_utilisation")
def _(static_slot_utilisation, rng, scenario):
    cases = [[scenario["short_len"]] * (scenario["batch_size"] - 1) + [scenario["long_len"]]]
    cases += [[rng.randint(1, 60) for _ in range(rng.randint(1, 12))] for _ in range(12)]
    passed = sum(close(static_slot_utilisation(list(c)), _simulated_utilisation(c), 1e-6) for c in cases)
    return partial(passed, len(cases), "batches")


def queue_ratios(s: dict) -> dict[str, float]:
    """The reference: the three ratios of scenario `s`, measured on the simulator at a flat step cost."""
    from lab_utils.sim import ContinuousBatching, StaticBatching, StepCostModel, fixed_workload, simulate

    flat = StepCostModel(fixed_s=1.0, per_token_s=0.0)  # one second per step: time counts steps
    B, short, long_, P = s["batch_size"], s["short_len"], s["long_len"], s["prompt_len"]
    outs = [short] * (B - 1) + [long_]
    static = simulate(fixed_workload([P] * B, outs), StaticBatching(B), flat)
    # same mix, endless queue: steady state = every continuous slot busy vs the static batch's share
    busy = sum(len(st.decode) for st in static.steps) + B
    rows = B * len(static.steps)
    same_mix = rows / busy
    # short requests queued behind the batch: requests finished and tokens produced while the
    # long request runs
    extra = B * (long_ // short + 2)
    queued = fixed_workload([P] * (B + extra), outs + [short] * extra)
    horizon = float(long_) + 1e-9  # prefill samples the first token, so long_ steps finish the long one
    done = {}
    for name, policy in (
        ("static", StaticBatching(B)),
        ("continuous", ContinuousBatching(B, max(2048, B * P))),
    ):
        run = simulate(queued, policy, flat)
        finished = sum(1 for r in run.requests if r.finish_time <= horizon)
        produced = sum(len(st.sampled) for st in run.steps if st.end <= horizon)
        done[name] = (finished, produced)
    return {
        "RATIO_SAME_MIX": same_mix,
        "RATIO_SHORT_QUEUE_REQUESTS": done["continuous"][0] / done["static"][0],
        "RATIO_SHORT_QUEUE_TOKENS": done["continuous"][1] / done["static"][1],
    }


@hidden("03.queue_ratios")
def _(RATIO_SAME_MIX, RATIO_SHORT_QUEUE_REQUESTS, RATIO_SHORT_QUEUE_TOKENS, rng, scenario):
    want = queue_ratios(scenario)
    got = {
        "RATIO_SAME_MIX": RATIO_SAME_MIX,
        "RATIO_SHORT_QUEUE_REQUESTS": RATIO_SHORT_QUEUE_REQUESTS,
        "RATIO_SHORT_QUEUE_TOKENS": RATIO_SHORT_QUEUE_TOKENS,
    }
    wrong = [k for k in want if not close(got[k], want[k], 0.02)]
    if len(wrong) == len(want):
        raise AssertionError("none of the ratios matches the grader's scenario")
    return 1 - len(wrong) / len(want) if wrong else None


def no_queue_gain(s: dict) -> float:
    """The reference model: the simulator's continuous / static tokens-per-second ratio for the batch."""
    from lab_utils.sim import ContinuousBatching, StaticBatching, simulate, summarize

    batch, cost = scenario_batch(s), scenario_cost(s)
    B = s["batch_size"]
    static = summarize(simulate(batch, StaticBatching(B, pad_finished=True), cost)).output_tokens_per_s
    cont = summarize(
        simulate(batch, ContinuousBatching(B, max(2048, B * s["prompt_len"])), cost)
    ).output_tokens_per_s
    return cont / static


GAIN_TOLERANCE = 0.03  # the prediction may differ from the simulator by 3%


@hidden("03.predict_gain")
def _(PREDICTED_NO_QUEUE_GAIN, rng, scenario):
    assert close(PREDICTED_NO_QUEUE_GAIN, no_queue_gain(scenario), GAIN_TOLERANCE), (
        "the prediction is more than 3% away from the simulator on the grader's scenario"
    )


@hidden("03.measured_gain")
def _(MEASURED_GAIN, rng, scenario):
    from lab_utils.grading.provenance import verify
    from lab_utils.sim.measure import _throughput

    assert verify(MEASURED_GAIN), "not a measurement from this run"
    raw = MEASURED_GAIN.raw_samples()
    lens = sorted(int(s[0]) for s in raw["static"])
    want_lens = sorted([scenario["short_len"]] * (scenario["batch_size"] - 1) + [scenario["long_len"]])
    assert lens == want_lens and int(raw["batch_size"]) == scenario["batch_size"], (
        "the measurement is not of the scenario's batch"
    )
    ratio = _throughput(raw["continuous"]) / _throughput(raw["static"])
    assert close(ratio, no_queue_gain(scenario), 1e-6), "the samples do not re-derive the scenario's gain"


def _random_trace(rng):
    from lab_utils.sim import ContinuousBatching, LengthDist, poisson_workload

    bs, seqs = rng.choice([2, 4, 8]), rng.randint(1, 6)
    budget, chunk = rng.randint(seqs, 40), rng.random() < 0.7
    wl = poisson_workload(
        rng.randint(3, 18),
        rng.uniform(0.5, 8.0),
        LengthDist("uniform", low=2, high=30 if chunk else max(3, budget // 2)),
        LengthDist("uniform", low=1, high=12),
        seed=rng.randint(0, 10**6),
    )
    if not chunk:
        wl = [w for w in wl if w.prompt_len + w.output_len <= budget] or wl[:0]
    if not wl:
        return None
    need = max(-(-(w.prompt_len + w.output_len - 1) // bs) for w in wl)
    blocks = rng.choice([None, need, need + 2, 3 * need])
    return wl, ContinuousBatching(seqs, budget, chunk, blocks, bs)


@hidden("03.continuous_step")
def _(my_schedule, rng, scenario):
    traces = [t for t in (_random_trace(rng) for _ in range(24)) if t is not None][:16]
    passed = sum(_same_plans(my_schedule, wl, cfg) for wl, cfg in traces)
    return partial(passed, len(traces), "traces")


def _reference_goodput(reqs, ttft_slo: float, tpot_slo: float) -> float:
    from lab_utils.sim import SLO, goodput
    from lab_utils.sim.results import RequestRecord, SimResult

    records = []
    for i, (arrival, first, finish, n) in enumerate(reqs):
        r = RequestRecord(i, arrival, 1, n)
        r.first_token_time, r.finish_time = first, finish
        records.append(r)
    return goodput(SimResult("given", 1, records), SLO(ttft_s=ttft_slo, tpot_s=tpot_slo))


@hidden("03.goodput")
def _(goodput_rps, rng, scenario):
    passed, total = 0, 15
    for _ in range(total):
        reqs = []
        for _ in range(rng.randint(1, 12)):
            arrival = rng.uniform(0, 5)
            first = arrival + rng.uniform(0.01, 2.0)
            n = rng.choice([1, 1, 2, 5, 20, 100])
            reqs.append((arrival, first, first + (n - 1) * rng.uniform(0.01, 0.3), n))
        ttft, tpot = rng.uniform(0.1, 2.0), rng.uniform(0.02, 0.3)
        want = _reference_goodput(reqs, ttft, tpot)
        passed += close(goodput_rps([tuple(r) for r in reqs], ttft, tpot), want, 1e-6) or (
            want == 0 and float(goodput_rps([tuple(r) for r in reqs], ttft, tpot)) == 0
        )
    return partial(passed, total, "request sets")


def batcher_outcome(s: dict, delay_us: int, preferred) -> tuple[float, float]:
    """(p99 latency in ms, mean batch size) of a dynamic-batcher setting on scenario `s`."""
    from lab_utils.sim import DynamicBatching, simulate, summarize

    workload, cost = triton_scenario(s)
    res = simulate(
        workload, DynamicBatching(s["triton_max_batch_size"], tuple(preferred), int(delay_us)), cost
    )
    return summarize(res).e2e_p99 * 1e3, len(res.requests) / len(res.steps)


TRITON_GRID = [
    (pref, delay) for pref in [(), (4,), (8,), (4, 8), (16,)] for delay in [0, 5_000, 10_000, 20_000, 30_000]
]


P99_SLACK = 0.15  # full points within 15% of the best p99 that meets the mean batch


@hidden("03.dynamic_batcher")
def _(MAX_QUEUE_DELAY_US, PREFERRED_BATCH_SIZE, rng, scenario):
    p99_ms, mean_batch = batcher_outcome(scenario, int(MAX_QUEUE_DELAY_US), _preferred(PREFERRED_BATCH_SIZE))
    if p99_ms > scenario["triton_p99_slo_ms"] or mean_batch < scenario["triton_min_mean_batch"]:
        raise AssertionError("the setting misses an objective of the grader's scenario")
    best = min(
        p
        for p, b in (batcher_outcome(scenario, d, pref) for pref, d in TRITON_GRID)
        if b >= scenario["triton_min_mean_batch"]
    )
    return None if p99_ms <= best * (1 + P99_SLACK) else 0.5


@hidden("03.relative_error")
def _(relative_error, rng, scenario):
    passed, total = 0, 12
    for _ in range(total):
        measured = rng.uniform(0.01, 500.0)
        predicted = measured * rng.uniform(0.2, 3.0)
        passed += close(relative_error(predicted, measured), (predicted - measured) / measured, 1e-9)
    return partial(passed, total, "pairs")
